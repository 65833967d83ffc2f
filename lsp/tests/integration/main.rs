//! The language server's integration tests, one test binary (`cargo test -p miles-lsp --test
//! integration`; link time dominates a test build, issue #34). Each module was a test binary of
//! its own; `support` is the in-process client they share. Snapshots are in `snapshots/`, named
//! `integration__MODULE__NAME.snap`.

mod support;

mod features;
mod neovim;
mod packages;
mod panics;
mod random_edits;
