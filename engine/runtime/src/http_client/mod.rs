//! The runtime's one blocking HTTP client, over `ureq` (no tokio: the workspace's async HTTP
//! stack lives in engine/workers): JSON POSTs and GETs to a service (a reward service, an
//! OpenEnv server, an SGLang-compatible rollout server), `http://` or `https://` (rustls over
//! ring, Mozilla's roots from `webpki-roots`; no OpenSSL). Each request has one deadline over
//! resolving, connecting, TLS, sending and the whole answer (a server that drips its answer a
//! byte at a time ends there too), and an answer longer than the cap is refused as soon as it is
//! known to be (its `Content-Length`, else the first byte past the cap). No redirects are
//! followed and no proxy variable is read: a service is named by its own URL. The TLS settings
//! are shared with the WebSocket client of env/ws.rs (`Client::tls`).

use serde_json::Value;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use ureq::http::Uri;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

/// The largest answer read.
pub const MAX_ANSWER: usize = 64 << 20;

/// An `http://` or `https://` URL, checked once when a run starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Url {
    /// `https://` (TLS).
    pub secure: bool,
    /// As written, brackets of an IPv6 address included.
    pub host: String,
    pub port: u16,
    /// The path with its query, `/` at least.
    pub path: String,
}

impl Url {
    /// The URL as `scheme://host:port/path` (`http`/`https`).
    pub fn http(&self) -> String {
        self.with_scheme(if self.secure { "https" } else { "http" })
    }

    /// The same address as a WebSocket URL (`ws`/`wss`).
    pub fn ws(&self) -> String {
        self.with_scheme(if self.secure { "wss" } else { "ws" })
    }

    fn with_scheme(&self, scheme: &str) -> String {
        format!("{scheme}://{}:{}{}", self.host, self.port, self.path)
    }
}

/// Reads `http://host[:port]/path` or `https://...`; the error says what is wrong, without the
/// URL (the caller names it).
pub fn parse_url(url: &str) -> Result<Url, String> {
    let uri: Uri = url.parse().map_err(|e| format!("is not a URL ({e})"))?;
    let secure = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("must start with http:// or https://".into()),
    };
    let authority = uri.authority().ok_or("has no host")?;
    if authority.as_str().contains('@') {
        // Credentials in a URL end up in logs and error messages.
        return Err("must not carry credentials (user@host)".into());
    }
    if authority.host().is_empty() {
        return Err("has no host".into());
    }
    // What follows the host is `:port` or nothing (the `@` of credentials is refused above).
    let port_text = authority.as_str()[authority.host().len()..].trim_start_matches(':');
    let port = match authority.port() {
        Some(p) => p.as_u16(),
        None if !port_text.is_empty() || authority.as_str().ends_with(':') => {
            return Err(format!("bad port `{port_text}`"))
        }
        None if secure => 443,
        None => 80,
    };
    let path = uri.path_and_query().map(|p| p.as_str()).filter(|p| !p.is_empty()).unwrap_or("/");
    Ok(Url { secure, host: authority.host().to_string(), port, path: path.to_string() })
}

/// What went wrong with one request; `retry` says whether another try may succeed.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    pub what: String,
    pub retry: bool,
    pub timed_out: bool,
}

fn transient(what: String) -> HttpError {
    HttpError { what, retry: true, timed_out: false }
}

fn final_(what: String) -> HttpError {
    HttpError { what, retry: false, timed_out: false }
}

/// Whether a key can travel in an HTTP header as `Bearer KEY`: printable ASCII, no spaces (also
/// what keeps a key from smuggling a line break into the request).
pub fn valid_api_key(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic())
}

/// An answer: its status and its body, as text (not UTF-8 is replaced, as a message shows it).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// The body of a 2xx answer; any other status is an error, 429 and 5xx transient (busy or
    /// broken for now: another try may succeed).
    pub fn ok(self) -> Result<String, HttpError> {
        let what = || format!("HTTP {}: {}", self.status, crate::quote::truncate(self.body.trim(), 200));
        match self.status {
            200..=299 => Ok(self.body),
            429 | 500..=599 => Err(transient(what())),
            _ => Err(final_(what())),
        }
    }

    /// The body as JSON: `null` when empty, a JSON string holding the text when not JSON.
    pub fn json(&self) -> Value {
        if self.body.is_empty() {
            return Value::Null;
        }
        serde_json::from_str(&self.body).unwrap_or_else(|_| Value::String(self.body.clone()))
    }
}

/// Whom `https://` trusts.
#[derive(Debug, Clone)]
pub enum Roots {
    /// Mozilla's roots (`webpki-roots`), the same on every machine.
    WebPki,
    /// Only these certificates (DER): a service's own CA, a test's self-signed certificate.
    Only(Vec<Vec<u8>>),
}

/// An HTTP client: its trust and answer cap. `Client::shared()` is the one the runtime uses.
#[derive(Debug, Clone)]
pub struct Client {
    agent: ureq::Agent,
    roots: Roots,
    max_answer: usize,
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl Client {
    pub fn new(roots: Roots, max_answer: usize) -> Client {
        let root_certs = match &roots {
            Roots::WebPki => RootCerts::WebPki,
            Roots::Only(ders) => {
                RootCerts::new_with_certs(&ders.iter().map(|d| Certificate::from_der(d).to_owned()).collect::<Vec<_>>())
            }
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .proxy(None)
            .max_response_header_size(64 << 10)
            .user_agent("miles")
            .tls_config(TlsConfig::builder().provider(TlsProvider::Rustls).root_certs(root_certs).build())
            .build()
            .new_agent();
        Client { agent, roots, max_answer, tls: OnceLock::new() }
    }

    /// Mozilla's roots, answers up to `MAX_ANSWER`; made once per process (the pool of kept-alive
    /// connections and the parsed roots are shared).
    pub fn shared() -> &'static Client {
        static SHARED: OnceLock<Client> = OnceLock::new();
        SHARED.get_or_init(|| Client::new(Roots::WebPki, MAX_ANSWER))
    }

    /// The largest answer read.
    pub fn max_answer(&self) -> usize {
        self.max_answer
    }

    /// The rustls settings of this client's trust, for a connection ureq does not make (wss).
    pub fn tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.tls.get_or_init(|| rustls_config(&self.roots).map(Arc::new)).clone()
    }

    /// One request: `body` (JSON text) is POSTed when given, else a GET. The whole request,
    /// answer included, ends within `timeout`. The key goes as `Authorization: Bearer` and into
    /// no error.
    pub fn request(
        &self,
        url: &Url,
        body: Option<&str>,
        timeout: Duration,
        key: Option<&str>,
    ) -> Result<Answer, HttpError> {
        let auth = match key {
            Some(k) if valid_api_key(k) => Some(format!("Bearer {k}")),
            Some(_) => return Err(final_("the API key must be printable ASCII without spaces".into())),
            None => None,
        };
        let target = url.http();
        let phase = |e: ureq::Error, receiving: bool| self.error(e, timeout, receiving);
        let sent = match body {
            Some(b) => {
                let mut r = self.agent.post(&target).config().timeout_global(Some(timeout)).build();
                r = r.header("Content-Type", "application/json").header("Accept", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b)
            }
            None => {
                let mut r = self.agent.get(&target).config().timeout_global(Some(timeout)).build();
                r = r.header("Accept", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
        };
        let mut answer = sent.map_err(|e| phase(e, false))?;
        let status = answer.status().as_u16();
        let cap = self.max_answer as u64;
        if let Some(n) = answer.body().content_length().filter(|n| *n > cap) {
            // Refused before a byte of it is read.
            return Err(final_(format!("answer of {n} bytes is longer than {cap} bytes")));
        }
        let bytes = answer.body_mut().with_config().limit(cap).read_to_vec().map_err(|e| phase(e, true))?;
        Ok(Answer { status, body: String::from_utf8_lossy(&bytes).into_owned() })
    }

    fn error(&self, e: ureq::Error, timeout: Duration, receiving: bool) -> HttpError {
        use ureq::Error as E;
        let within = format!("{:.1}s", timeout.as_secs_f64());
        let timed_out = |what: String| HttpError { what, retry: true, timed_out: true };
        match e {
            // The whole request's deadline is one (global) timeout: the phase is where it fired.
            E::Timeout(_) if receiving => timed_out(format!("no answer within {within} (receiving)")),
            E::Timeout(_) => timed_out(format!("no answer within {within}")),
            E::Io(io) if matches!(io.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) => {
                timed_out(format!("no answer within {within}"))
            }
            E::BodyExceedsLimit(n) => final_(format!("answer longer than {n} bytes")),
            E::LargeResponseHeader(_, cap) => final_(format!("answer head longer than {cap} bytes")),
            E::HostNotFound => transient("cannot resolve the host".into()),
            E::ConnectionFailed => transient("cannot connect".into()),
            E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                transient(format!("cannot connect: {io}"))
            }
            E::Io(io) if tls_failure(&io).is_some() => final_(format!("TLS: {io}")),
            E::Io(io) if receiving => transient(format!("receiving: {io}")),
            E::Io(io) => transient(format!("cannot connect or send: {io}")),
            // A certificate the roots do not vouch for, a name it does not cover: no retry mends it.
            E::Rustls(t) => final_(format!("TLS: {t}")),
            E::Tls(t) => final_(format!("TLS: {t}")),
            E::BadUri(u) => final_(format!("bad URL: {u}")),
            // Malformed answers (a broken or overloaded server) may be mended by another try.
            E::Protocol(p) => transient(format!("not an HTTP answer: {p}")),
            other => transient(other.to_string()),
        }
    }
}

/// The TLS refusal inside `e` (an untrusted certificate, a name it does not cover, a failed
/// handshake), which no retry mends.
pub(crate) fn tls_failure(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// ring, as ureq's `rustls` feature and the workers' TLS use: it builds without cmake (aws-lc-rs,
/// the provider with post-quantum key exchange, does not); its classical X25519 is what rustls
/// deprecates.
#[allow(deprecated)]
pub(crate) fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls settings for `roots`, over ring (what ureq uses for `https://`).
fn rustls_config(roots: &Roots) -> Result<rustls::ClientConfig, String> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Roots::WebPki => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Roots::Only(ders) => {
            for d in ders {
                // A certificate rustls cannot read is left out: nothing it vouches for is trusted.
                let _ = store.add(rustls::pki_types::CertificateDer::from(d.clone()));
            }
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_root_certificates(store)
        .with_no_client_auth())
}

/// `url` checked, each error naming it.
fn checked(url: &str) -> Result<Url, HttpError> {
    parse_url(url).map_err(|e| final_(format!("{url}: {e}")))
}

fn named(url: &str, e: HttpError) -> HttpError {
    HttpError { what: format!("{url}: {}", e.what), ..e }
}

/// POSTs `body` to `url` with the shared client: the status and the answer as JSON (`null`
/// when empty, a string when not JSON). Errors name the URL and never the key.
pub fn post_json(url: &str, body: &Value, timeout: Duration, key: Option<&str>) -> Result<(u16, Value), HttpError> {
    let u = checked(url)?;
    let a = Client::shared().request(&u, Some(&body.to_string()), timeout, key).map_err(|e| named(url, e))?;
    Ok((a.status, a.json()))
}

/// GETs `url` with the shared client, as `post_json`.
pub fn get_json(url: &str, timeout: Duration, key: Option<&str>) -> Result<(u16, Value), HttpError> {
    let u = checked(url)?;
    let a = Client::shared().request(&u, None, timeout, key).map_err(|e| named(url, e))?;
    Ok((a.status, a.json()))
}

#[cfg(test)]
pub(crate) mod tests;
