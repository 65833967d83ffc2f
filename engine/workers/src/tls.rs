//! TLS between a run's processes once they listen beyond loopback: the worker protocol (gRPC) and
//! the weight streams (broadcast, p2p, the shared-memory and NCCL channels' control sockets:
//! `transport/conn.rs`), both under the same certificate (docs/distributed.md, "Network security").
//!
//! The run's identity is an Ed25519 key derived from its token (SHA-256 of a label and the
//! token), with a self-signed certificate for the name `miles-run`. Every process of the run
//! derives the same key from the token it already holds, so the key travels exactly where the
//! token travels (environment or a private file, never argv or job metadata) and nowhere else;
//! each side trusts that one certificate alone (the pin), so a peer without the token can neither
//! read the traffic nor pose as a worker or the controller. The token is still checked inside
//! TLS, on every call and stream.
//!
//! Loopback stays plaintext unless forced (`MILES_TLS=always`): it is one machine's trust
//! boundary, and the weight stream's bandwidth there is memory bandwidth.

use sha2::{Digest, Sha256};

/// Set to `always` to use TLS on loopback too (workers inherit it from `miles run`).
pub const TLS_ENV: &str = "MILES_TLS";
/// The name in the run's certificate, which clients ask for.
pub const SERVER_NAME: &str = "miles-run";

/// When a listener or a connection uses TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Beyond loopback only.
    Auto,
    /// Everywhere, loopback included.
    Always,
}

impl TlsMode {
    /// `MILES_TLS=always` forces TLS; anything else is [`TlsMode::Auto`].
    pub fn from_env() -> TlsMode {
        match std::env::var(TLS_ENV).as_deref() {
            Ok("always") | Ok("1") => TlsMode::Always,
            _ => TlsMode::Auto,
        }
    }

    /// Whether traffic to or from `addr` (`host:port`, a bound or advertised address) is
    /// encrypted. An address that does not resolve counts as beyond loopback.
    pub fn wanted(self, addr: &str) -> bool {
        use std::net::ToSocketAddrs;
        self == TlsMode::Always || !addr.to_socket_addrs().map(|mut a| a.all(|x| x.ip().is_loopback())).unwrap_or(false)
    }
}

/// The run's certificate and key, derived from its token.
#[derive(Clone)]
pub struct RunTls {
    cert_pem: String,
    key_pem: String,
    cert_der: Vec<u8>,
    key_der: Vec<u8>,
    /// The run's Ed25519 public key.
    public_key: Vec<u8>,
}

impl RunTls {
    pub fn derive(token: &str) -> Result<RunTls, String> {
        let seed = Sha256::new().chain_update(b"miles-run-tls/1\0").chain_update(token.as_bytes()).finalize();
        // PKCS#8 v1 of an Ed25519 key: a fixed prefix, then the 32-byte seed (RFC 8410).
        let mut pkcs8 =
            vec![0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
        pkcs8.extend_from_slice(&seed);
        let key =
            rcgen::KeyPair::try_from(pkcs8.as_slice()).map_err(|e| format!("cannot make the run's TLS key: {e}"))?;
        let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .map_err(|e| format!("cannot make the run's TLS certificate: {e}"))?;
        let cert = params.self_signed(&key).map_err(|e| format!("cannot make the run's TLS certificate: {e}"))?;
        Ok(RunTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
            public_key: key.public_key_raw().to_vec(),
        })
    }

    /// The SHA-256 of the run's public key (hex): what every side pins, for logs.
    pub fn fingerprint(&self) -> String {
        Sha256::digest(&self.public_key).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A gRPC server, encrypting under the run's certificate when `on`.
    pub fn grpc_server_builder(&self, on: bool) -> Result<tonic::transport::Server, String> {
        let b = tonic::transport::Server::builder();
        match on {
            true => b.tls_config(self.grpc_server()).map_err(|e| format!("TLS: {e}")),
            false => Ok(b),
        }
    }

    /// A gRPC endpoint for `host_port`: `https` trusting the run's certificate alone when `on`.
    pub fn grpc_endpoint(&self, host_port: &str, on: bool) -> Result<tonic::transport::Endpoint, String> {
        let url = format!("{}://{host_port}", if on { "https" } else { "http" });
        let ep = tonic::transport::Endpoint::from_shared(url).map_err(|e| format!("bad address {host_port}: {e}"))?;
        match on {
            true => ep.tls_config(self.grpc_client()).map_err(|e| format!("TLS: {e}")),
            false => Ok(ep),
        }
    }

    /// A gRPC server's TLS.
    pub fn grpc_server(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem))
    }

    /// A gRPC client's TLS: the run's certificate is the only one trusted.
    pub fn grpc_client(&self) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.cert_pem))
            .domain_name(SERVER_NAME)
    }

    /// A weight receiver's TLS (rustls, blocking once the handshake is done): the run's
    /// certificate, TLS 1.3 or 1.2 with ring's safe defaults.
    pub fn stream_server(&self) -> Result<std::sync::Arc<rustls::ServerConfig>, String> {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(self.cert_der.clone())], key)
            .map(std::sync::Arc::new)
            .map_err(|e| format!("TLS: {e}"))
    }

    /// A weight sender's TLS: the run's certificate is the only one trusted (as for gRPC).
    pub fn stream_client(&self) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(rustls::pki_types::CertificateDer::from(self.cert_der.clone())).map_err(|e| format!("TLS: {e}"))?;
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))
            .map(|b| std::sync::Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
    }
}

/// ring, explicitly: the process may link other providers, and rustls refuses to guess. rustls
/// deprecates it for lacking post-quantum key exchange, whose provider (aws-lc) needs a C and
/// CMake build; the worker protocol's TLS (tonic's `tls-ring`) uses the same one.
fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_identity_is_derived_from_the_token_alone() {
        let (a, b, other) =
            (RunTls::derive("tok").unwrap(), RunTls::derive("tok").unwrap(), RunTls::derive("tak").unwrap());
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), other.fingerprint());
        assert_eq!(a.fingerprint().len(), 64);
    }

    #[test]
    fn tls_is_wanted_beyond_loopback_or_when_forced() {
        assert!(!TlsMode::Auto.wanted("127.0.0.1:5000"));
        assert!(!TlsMode::Auto.wanted("[::1]:5000"));
        assert!(TlsMode::Auto.wanted("10.1.2.3:5000"));
        assert!(TlsMode::Auto.wanted("0.0.0.0:5000"));
        assert!(TlsMode::Always.wanted("127.0.0.1:5000"));
    }
}
