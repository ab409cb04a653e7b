//! object_store's errors as errnos an application understands.

use tierfs_store::Errno;

/// The errno for `e`; anything the server or the network did that has no POSIX meaning is
/// EIO (logged by the caller with the error's text). A server that cannot be reached (refused
/// or timed-out connections, after object_store's retries) is ENOTCONN, as a dead FUSE store
/// is: tierfs then serves what it has cached and probes the server until it answers again
/// (`Store::reconnect`, crates/tierfs-fs/src/health.rs).
pub fn errno(e: &object_store::Error) -> Errno {
    use object_store::Error as E;
    if unreachable(e) {
        return Errno::ENOTCONN;
    }
    match e {
        E::NotFound { .. } => Errno::ENOENT,
        // The object changed since we read its ETag: the handle's version is gone.
        E::Precondition { .. } => Errno(libc::ESTALE),
        E::AlreadyExists { .. } => Errno(libc::EEXIST),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Errno(libc::EACCES),
        E::NotSupported { .. } | E::NotImplemented { .. } => Errno(libc::ENOTSUP),
        E::InvalidPath { .. } => Errno(libc::EINVAL),
        _ => Errno::EIO,
    }
}

/// Whether `e` says the server could not be reached at all (no answer), as opposed to an
/// answer that was an error. object_store wraps reqwest's error in its retry error without a
/// kind of its own, so its text is what there is to go by.
fn unreachable(e: &object_store::Error) -> bool {
    let mut text = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        text.push_str(&s.to_string());
        src = s.source();
    }
    let t = text.to_ascii_lowercase();
    [
        "connection refused",
        "error trying to connect",
        "tcp connect error",
        "timed out",
        "operation timed out",
        "connection reset",
        "broken pipe",
    ]
    .iter()
    .any(|p| t.contains(p))
}

/// A one-line description of `e` for the user: S3's error code where the server gave one
/// (object_store puts the whole XML body in its message).
pub fn describe(e: &object_store::Error) -> String {
    let text = e.to_string();
    let code = text
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code.to_string());
    match code.as_deref() {
        Some("NoSuchBucket") => "no such bucket".into(),
        Some(c @ ("InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied")) => {
            format!("the server refused the credentials ({c})")
        }
        Some(c) => format!("the server answered {c}"),
        // Nothing reached a server (a wrong endpoint, a port nothing listens on, a name that
        // does not resolve): the innermost cause says which, the layers above it do not.
        None if text.contains("error sending request") => {
            let mut root: &dyn std::error::Error = e;
            while let Some(s) = root.source() {
                root = s;
            }
            let why = root.to_string();
            format!(
                "cannot reach the server: {}",
                why.lines().next().unwrap_or_default()
            )
        }
        // An HTTP error with no S3 error in its body: whatever answered is not an S3 server
        // (a web server, a proxy, the wrong port of a cluster), or not for this path.
        None => match status_without_code(&text) {
            Some(status) => format!(
                "the server answered HTTP {status} with no S3 error in its body: is the \
                 endpoint an S3 server (and the bucket's name right)?"
            ),
            None => text
                .lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect(),
        },
    }
}

/// The HTTP status object_store reports for an answer that was not 2xx ("404 Not Found").
fn status_without_code(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once("non-2xx status code: ")?;
    let status = rest.split(':').next()?.trim();
    (!status.is_empty()).then_some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(msg: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        }
    }

    #[test]
    fn an_answer_that_is_not_s3_says_so() {
        // As object_store words a listing a web server answered with its 404 page.
        let e = generic(
            "Error performing list request: Error performing GET http://h:9000/b?list-type=2 \
             in 1.2ms - Server returned non-2xx status code: 404 Not Found: <html>nope</html>",
        );
        let d = describe(&e);
        assert!(d.contains("HTTP 404 Not Found"), "{d}");
        assert!(d.contains("is the endpoint an S3 server"), "{d}");
        assert!(!d.contains('\n') && !d.contains("<html>"), "{d}");
    }

    #[test]
    fn an_s3_error_code_is_named() {
        let e = generic(
            "Server returned non-2xx status code: 404 Not Found: \
             <Error><Code>NoSuchBucket</Code></Error>",
        );
        assert_eq!(describe(&e), "no such bucket");
    }
}
