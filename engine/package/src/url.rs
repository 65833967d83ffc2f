//! The git URLs a package may name: `https://`, `ssh://`, scp-like `[user@]host:path`,
//! `file://` and absolute local paths. Everything else is refused before git sees it: git reads
//! an argument starting with `-` as an option (`--upload-pack=...` runs a command), and its
//! transport helpers (`ext::sh -c ...`, `fd::`) run commands too. Plain `http://` and `git://`
//! are refused because nothing authenticates what they return.

/// The protocols git itself may use (`GIT_ALLOW_PROTOCOL` for every git command): the same list,
/// enforced a second time by git, redirects and submodules included.
pub const GIT_PROTOCOLS: &str = "https:ssh:file";

/// `Ok` when `url` is a git URL a package may name; otherwise why not, in words.
pub fn check(url: &str) -> Result<(), String> {
    const ALLOWED: &str = "use https://, ssh://, [user@]host:path, file:// or an absolute path";
    if url.is_empty() {
        return Err("the URL is empty".into());
    }
    if url.starts_with('-') {
        return Err(format!("`{url}` starts with `-`, which git would read as an option"));
    }
    if url.chars().any(char::is_control) {
        return Err("the URL holds a control character".into());
    }
    if url.contains("::") {
        return Err(format!(
            "`{url}` names a git transport helper (`TRANSPORT::address`), which can run commands; {ALLOWED}"
        ));
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        return match scheme {
            "https" | "ssh" => host_ok(url, rest),
            "file" => Ok(()),
            _ => Err(format!("the scheme `{scheme}://` is not allowed; {ALLOWED}")),
        };
    }
    if url.starts_with('/') {
        return Ok(());
    }
    // git reads `host:path` as scp-like ssh only when no `/` comes before the first `:`.
    if let Some((login, path)) = url.split_once(':') {
        if !login.contains('/') && !path.is_empty() {
            let host = login.rsplit_once('@').map_or(login, |(user, host)| if word(user) { host } else { "" });
            if word(host) {
                return Ok(());
            }
            return Err(format!("`{url}` is not a valid `[user@]host:path` address"));
        }
    }
    Err(format!("`{url}` is a relative path or an unknown form; {ALLOWED}"))
}

/// A user or host name: letters, digits, `.`, `_`, `-`, not starting with `-`.
fn word(s: &str) -> bool {
    !s.is_empty() && !s.starts_with('-') && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// The authority of an `https://` or `ssh://` URL: a host git will not read as an option.
fn host_ok(url: &str, rest: &str) -> Result<(), String> {
    let authority = rest.split('/').next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() || host.starts_with('-') {
        return Err(format!("`{url}` has no valid host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_forms() {
        for url in [
            "https://git.example.com/platform.git",
            "ssh://git@example.com:2222/platform.git",
            "git@github.com:team/platform.git",
            "example.com:platform.git",
            "file:///srv/git/platform",
            "/srv/git/platform.git",
        ] {
            assert_eq!(check(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn refused_forms() {
        for (url, why) in [
            ("--upload-pack=touch /tmp/x", "option"),
            ("-uevil", "option"),
            ("ext::sh -c touch% /tmp/x", "transport helper"),
            ("fd::3", "transport helper"),
            ("http://example.com/p.git", "scheme `http://`"),
            ("git://example.com/p.git", "scheme `git://`"),
            ("ssh://-oProxyCommand=evil/x", "no valid host"),
            ("https://", "no valid host"),
            ("-oProxyCommand=x:path", "option"),
            ("us er@host:path", "not a valid"),
            ("../platform.git", "relative path"),
            ("platform", "relative path"),
            ("", "empty"),
            ("file:///x\n--upload-pack=y", "control character"),
        ] {
            let e = check(url).expect_err(url);
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
