//! The per-run token: the controller makes one, hands it to every worker through the
//! environment (never the command line, which other users can read in `ps`), and every gRPC call
//! and weight stream carries it. A call without it is refused.

use tonic::{Request, Status};

/// Metadata key of the token on gRPC calls.
pub const TOKEN_HEADER: &str = "x-miles-token";
/// Environment variable through which a launcher passes the token to a worker.
pub const TOKEN_ENV: &str = "MILES_RUN_TOKEN";

/// Compares in time independent of where the strings differ (no early exit on the first byte).
pub fn token_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0 && !a.is_empty()
}

/// 128 random bits from the kernel, hex.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A tonic interceptor that refuses calls without the run's token.
#[derive(Clone)]
pub struct CheckToken(pub std::sync::Arc<String>);

impl tonic::service::Interceptor for CheckToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match req.metadata().get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
            Some(t) if token_eq(t, &self.0) => Ok(req),
            Some(_) => Err(Status::unauthenticated("wrong run token")),
            None => Err(Status::unauthenticated("this worker serves only calls that carry the run's token")),
        }
    }
}

/// A client-side interceptor that adds the token to every call.
#[derive(Clone)]
pub struct AddToken(pub tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl AddToken {
    pub fn new(token: &str) -> Result<AddToken, String> {
        token.parse().map(AddToken).map_err(|_| "the run token is not printable ASCII".to_string())
    }
}

impl tonic::service::Interceptor for AddToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(TOKEN_HEADER, self.0.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(token_eq("abc", "abc"));
        assert!(!token_eq("abc", "abd"));
        assert!(!token_eq("abc", "abcd"));
        assert!(!token_eq("", ""));
        assert_eq!(new_token().unwrap().len(), 32);
    }
}
