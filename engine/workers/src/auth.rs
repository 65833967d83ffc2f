//! The per-run token: the controller makes one, hands it to every worker through the
//! environment or a private file (never the command line, which other users can read in `ps`, nor
//! a job's metadata). Every gRPC call carries it (inside TLS beyond loopback); a call without it
//! is refused. A weight stream never carries it: it opens with a challenge-response ([`prove`],
//! [`check_hello`]) in which each side proves it holds the token, checked before anything else
//! is read.

use tonic::{Request, Status};

/// Metadata key of the token on gRPC calls.
pub const TOKEN_HEADER: &str = "x-miles-token";
/// Environment variable through which a launcher passes the token to a worker.
pub const TOKEN_ENV: &str = "MILES_RUN_TOKEN";
/// Or the path of a file holding it, readable by its owner alone: for launchers whose environment
/// is shown to others (a Ray job's `runtime_env` is in its metadata and on the dashboard).
pub const TOKEN_FILE_ENV: &str = "MILES_RUN_TOKEN_FILE";

/// The worker's token: `MILES_RUN_TOKEN` (`env_token`), else the file `MILES_RUN_TOKEN_FILE` names,
/// which must be this user's and private (mode 0600 or tighter), as ssh asks of a key.
pub fn worker_token(env_token: Option<String>, file: Option<std::path::PathBuf>) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    if let Some(t) = env_token.filter(|t| !t.is_empty()) {
        return Ok(t);
    }
    let Some(path) = file else {
        return Err(format!(
            "{TOKEN_ENV} is not set (nor {TOKEN_FILE_ENV}): a worker serves only its run (the launcher sets one)"
        ));
    };
    let shown = path.display();
    let meta = std::fs::metadata(&path).map_err(|e| format!("{TOKEN_FILE_ENV}={shown}: {e}"))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    if meta.uid() != me || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{TOKEN_FILE_ENV}={shown} must belong to this user (uid {me}) and be private (mode 0600), \
             not uid {} mode {:o}",
            meta.uid(),
            meta.mode() & 0o777
        ));
    }
    let t = std::fs::read_to_string(&path).map_err(|e| format!("{TOKEN_FILE_ENV}={shown}: {e}"))?;
    match t.trim() {
        "" => Err(format!("{TOKEN_FILE_ENV}={shown} is empty")),
        t => Ok(t.to_string()),
    }
}

/// Compares in time independent of where the strings differ (no early exit on the first byte).
pub fn token_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0 && !a.is_empty()
}

/// The first bytes of every weight stream: this magic and the sender's nonce. The token itself
/// never crosses the socket: each side proves it holds it with an HMAC-SHA256 keyed by it over
/// both sides' fresh nonces (the receiver first, so a sender streams nothing to an impostor), and
/// a proof recorded on one connection answers no other (the receiver's nonce is new each time).
///
/// ```text
/// sender                                              receiver
///   "miles-auth/2", nonce S (32 bytes)       ──────▶  reads exactly these 44 bytes
///                                            ◀──────  "challenge <hex R> <hex HMAC(token, RECEIVER | S | R)>\n"
///   checks the receiver's proof;
///   HMAC(token, SENDER | R | S) (32 bytes)   ──────▶  reads exactly these, compares in constant time
///                                            ◀──────  "ok\n" or "err <why>\n"
/// ```
pub const HELLO_MAGIC: &[u8; 12] = b"miles-auth/2";
/// Bytes of each side's nonce.
pub const NONCE: usize = 32;
/// Bytes of a proof (HMAC-SHA256).
pub const PROOF: usize = 32;
/// The most a receiver reads from a connection before it knows the sender holds the token.
pub const MAX_HELLO: usize = HELLO_MAGIC.len() + NONCE + PROOF;
/// What each side's proof is about: distinct, so neither proof can stand in for the other.
const RECEIVER_PROOF: &[u8] = b"miles-weights/2 receiver proof\0";
const SENDER_PROOF: &[u8] = b"miles-weights/2 sender proof\0";

fn proof_key(token: &str) -> ring::hmac::Key {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.as_bytes())
}

fn proof(token: &str, context: &[u8], first: &[u8], second: &[u8]) -> ring::hmac::Tag {
    let mut c = ring::hmac::Context::with_key(&proof_key(token));
    for part in [context, first, second] {
        c.update(part);
    }
    c.sign()
}

/// Whether `tag` is the proof of `token` over (`context`, `first`, `second`); constant time.
fn proof_ok(token: &str, context: &[u8], first: &[u8], second: &[u8], tag: &[u8]) -> bool {
    let msg = [context, first, second].concat();
    !token.is_empty() && ring::hmac::verify(&proof_key(token), &msg, tag).is_ok()
}

/// A fresh nonce from the kernel's generator.
fn nonce() -> std::io::Result<[u8; NONCE]> {
    use ring::rand::SecureRandom;
    let mut n = [0u8; NONCE];
    ring::rand::SystemRandom::new().fill(&mut n).map_err(|_| std::io::Error::other("the system RNG failed"))?;
    Ok(n)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// A short public tag of the run (SHA-256 of a label and the token, 128 bits): what a weight
/// stream's header and a disk-delta file carry so that a receiver refuses another run's weights
/// without the token itself ever being written.
pub fn run_tag(token: &str) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::new().chain_update(b"miles-run-tag/1\0").chain_update(token.as_bytes()).finalize()[..16])
}

fn denied(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.into())
}

/// One line of at most 512 bytes, read byte by byte: nothing past its newline is consumed (the
/// stream is the caller's from there on).
fn read_short_line<S: std::io::Read>(s: &mut S) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 512 {
        if s.read(&mut b)? == 0 || b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// The sender's side of the hello on `s` (plaintext or TLS). A refusal, or a receiver that cannot
/// prove it holds `token`, is a `PermissionDenied` error saying why; then nothing has been sent
/// but the hello.
pub fn prove<S: std::io::Read + std::io::Write>(s: &mut S, token: &str) -> std::io::Result<()> {
    if token.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the run token is empty"));
    }
    let mine = nonce()?;
    s.write_all(&[HELLO_MAGIC.as_slice(), &mine].concat())?;
    s.flush()?;
    let line = read_short_line(s)?;
    if let Some(why) = line.strip_prefix("err ") {
        return Err(denied(why));
    }
    let challenge = line.strip_prefix("challenge ").and_then(|rest| {
        let (theirs, tag) = rest.split_once(' ')?;
        Some((unhex(theirs).filter(|n| n.len() == NONCE)?, unhex(tag)?))
    });
    let Some((theirs, tag)) = challenge else {
        return Err(denied(format!("no answer to the hello (got {line:?})")));
    };
    if !proof_ok(token, RECEIVER_PROOF, &mine, &theirs, &tag) {
        return Err(denied(
            "the receiver did not prove that it holds this run's token (an impostor, or another run's \
             engine); nothing was sent",
        ));
    }
    s.write_all(proof(token, SENDER_PROOF, &theirs, &mine).as_ref())?;
    s.flush()?;
    match read_short_line(s)?.as_str() {
        "ok" => Ok(()),
        l => Err(denied(
            l.strip_prefix("err ").map(str::to_string).unwrap_or_else(|| format!("no answer to the proof (got {l:?})")),
        )),
    }
}

/// The receiver's side of the hello: `Ok` once the sender has proved it holds `token`, else why it
/// was refused. Reads at most [`MAX_HELLO`] bytes; the caller answers "ok" or "err <why>".
pub async fn check_hello<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    token: &str,
) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut hello = [0u8; HELLO_MAGIC.len() + NONCE];
    s.read_exact(&mut hello).await.map_err(|e| format!("refused: no hello ({e})"))?;
    let (magic, theirs) = hello.split_at(HELLO_MAGIC.len());
    if magic != HELLO_MAGIC {
        return Err("refused: not a miles weight stream of this version (no hello)".into());
    }
    let mine = nonce().map_err(|e| format!("cannot draw a nonce: {e}"))?;
    let challenge = format!("challenge {} {}\n", hex(&mine), hex(proof(token, RECEIVER_PROOF, theirs, &mine).as_ref()));
    s.write_all(challenge.as_bytes()).await.map_err(|e| format!("refused: the sender left ({e})"))?;
    s.flush().await.map_err(|e| format!("refused: the sender left ({e})"))?;
    let mut tag = [0u8; PROOF];
    s.read_exact(&mut tag).await.map_err(|e| format!("refused: no proof of the token ({e})"))?;
    match proof_ok(token, SENDER_PROOF, &mine, theirs, &tag) {
        true => Ok(()),
        false => Err("refused: the sender did not prove that it holds this run's token".into()),
    }
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

/// A fake engine's door for tests: runs [`check_hello`] on `c` (bounded by 10 s), answers it, and
/// gives the connection back when the sender is let in.
#[cfg(test)]
pub(crate) fn answer_hello(c: std::net::TcpStream, token: &str) -> Result<std::net::TcpStream, String> {
    use tokio::io::AsyncWriteExt;
    c.set_nonblocking(true).map_err(|e| e.to_string())?;
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut c = tokio::net::TcpStream::from_std(c).map_err(|e| e.to_string())?;
        let v = tokio::time::timeout(std::time::Duration::from_secs(10), check_hello(&mut c, token))
            .await
            .unwrap_or_else(|_| Err("no hello within 10 s".into()));
        let answer = match &v {
            Ok(()) => "ok\n".to_string(),
            Err(why) => format!("err {why}\n"),
        };
        c.write_all(answer.as_bytes()).await.map_err(|e| e.to_string())?;
        v?;
        let c = c.into_std().map_err(|e| e.to_string())?;
        c.set_nonblocking(false).map_err(|e| e.to_string())?;
        Ok(c)
    })
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

    #[test]
    fn a_worker_reads_its_token_from_the_environment_or_a_private_file() {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(worker_token(Some("t".into()), None).unwrap(), "t");
        assert!(worker_token(None, None).unwrap_err().contains("MILES_RUN_TOKEN is not set"));
        let dir = std::env::temp_dir().join(format!("miles-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        std::fs::write(&f, "abc\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = worker_token(None, Some(f.clone())).unwrap_err();
        assert!(e.contains("private") && e.contains("644"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(worker_token(Some(String::new()), Some(f.clone())).unwrap(), "abc");
        assert!(worker_token(None, Some(dir.join("missing"))).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Runs [`prove`] with `sender_token` against [`check_hello`] with `receiver_token` over a
    /// loopback socket; returns both sides' results.
    fn exchange(sender_token: &str, receiver_token: &str) -> (std::io::Result<()>, Result<(), String>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = sender_token.to_string();
        let sender = std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
            prove(&mut c, &t)
        });
        let (c, _) = l.accept().unwrap();
        let checked = answer_hello(c, receiver_token).map(drop);
        (sender.join().unwrap(), checked)
    }

    #[test]
    fn each_side_proves_the_token_without_sending_it() {
        let (s, r) = exchange("tok", "tok");
        assert!(s.is_ok() && r.is_ok(), "{s:?} {r:?}");
        // Different tokens: the sender finds the receiver's proof wrong and stops there, whichever
        // side is the impostor; the receiver gets no proof.
        for (sender, receiver) in [("guess", "tok"), ("tok", "impostor")] {
            let (s, r) = exchange(sender, receiver);
            let e = s.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
            assert!(e.to_string().contains("receiver did not prove"), "{e}");
            assert!(r.unwrap_err().contains("no proof"));
        }
        // A sender that answers anyway, with a proof under a guessed token, is refused.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let guesser = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
            let mine = [1u8; NONCE];
            c.write_all(&[HELLO_MAGIC.as_slice(), &mine].concat()).unwrap();
            let line = read_short_line(&mut c).unwrap();
            let theirs = unhex(line.split(' ').nth(1).unwrap()).unwrap();
            c.write_all(proof("guess", SENDER_PROOF, &theirs, &mine).as_ref()).unwrap();
            let mut answer = String::new();
            let _ = c.read_to_string(&mut answer);
            answer
        });
        let (c, _) = l.accept().unwrap();
        assert!(answer_hello(c, "tok").unwrap_err().contains("sender did not prove"));
        assert!(guesser.join().unwrap().starts_with("err refused: the sender did not prove"));
        assert_eq!(
            prove(&mut std::io::Cursor::new(Vec::new()), "").unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_hello_is_checked_within_a_few_dozen_bytes() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let check = |bytes: &[u8]| {
            let mut r = bytes;
            let v = rt.block_on(check_hello(&mut tokio::io::join(&mut r, tokio::io::sink()), "tok"));
            (v, bytes.len() - r.len())
        };
        // A 64 MB header with no hello, then a hello with a wrong proof: both stop within MAX_HELLO.
        let mut huge = (64u32 << 20).to_le_bytes().to_vec();
        huge.resize(1 << 20, b'x');
        let (v, read) = check(&huge);
        assert!(v.unwrap_err().contains("not a miles weight stream"));
        assert!(read <= MAX_HELLO, "read {read} bytes");
        let mut long = HELLO_MAGIC.to_vec();
        long.resize(1 << 20, b'a');
        let (v, read) = check(&long);
        assert!(v.unwrap_err().contains("did not prove"));
        assert_eq!(read, MAX_HELLO);
        assert_eq!(unhex(&hex(&[0, 255, 16])), Some(vec![0, 255, 16]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(run_tag("tok"), run_tag("tok"));
        assert_ne!(run_tag("tok"), run_tag("tak"));
        assert_eq!(run_tag("tok").len(), 32);
    }
}
