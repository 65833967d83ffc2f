//! The package crate's integration tests, one test binary (`cargo test -p miles-package --test
//! integration`; link time dominates a test build, issue #34). Each module was a test binary of
//! its own.

mod git_packages;
mod hardening;
mod stdlib_doc;
