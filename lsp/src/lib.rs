//! The `.miles` language server (`miles lsp`). It speaks LSP over stdio through `lsp-server`;
//! everything it knows about the language comes from `miles_compiler` (the same `compile` the
//! CLI runs) and the protocol-free `miles_ide` layer. This crate alone knows LSP types.
//!
//! The standard library is embedded in the binary, so go-to-definition into `std/...` needs a
//! file an editor can open: the server writes the stdlib once, read-only, to a cache directory
//! (`$XDG_CACHE_HOME/miles/std-<version>/std/...`, else `~/.cache/...`, else the temp dir) and
//! answers with `file://` locations there. Every editor opens those without a custom URI scheme;
//! a document opened from there is analysed as the stdlib module it is, not as a user file.

pub mod convert;
mod packages;
mod server;
pub mod stdfiles;

pub use server::{serve, Config};

/// Runs the server on stdin/stdout until the client says `exit`.
pub fn run_stdio() -> Result<(), String> {
    let (connection, io_threads) = lsp_server::Connection::stdio();
    serve(connection, Config::default())?;
    io_threads.join().map_err(|e| e.to_string())
}
