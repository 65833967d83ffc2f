//! `miles-lsp`: the same server as `miles lsp`, for editors configured with a server binary of
//! its own (and for the tests that drive a real client).

fn main() -> std::process::ExitCode {
    match miles_lsp::run_stdio() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("miles lsp: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
