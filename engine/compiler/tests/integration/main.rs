//! The compiler's integration tests, one test binary (`cargo test -p miles-compiler --test
//! integration`; link time dominates a test build, issue #34). Each module was a test binary of
//! its own.

mod fmt_meaning;
mod packages;
