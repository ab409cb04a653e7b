//! Signed S3 requests that `object_store` cannot make: keys ending in `/` (directory markers:
//! its `Path` has no trailing slash) and a multipart upload completed under a condition
//! (If-Match / If-None-Match on CompleteMultipartUpload, so a large upload cannot overwrite
//! another writer's object; object_store completes unconditionally).
//!
//! The signing is object_store's own (`AwsAuthorizer`) and so is the HTTP client (its reqwest
//! connector with the store's client options): only the request line is ours.

use crate::config::S3Config;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{HttpClient, HttpConnector, HttpRequest, ReqwestConnector};
use object_store::ClientOptions;
use std::time::Duration;
use tierfs_store::Errno;

/// Tries of one request that failed in transit or with a 5xx (the same as object_store's
/// retry count), and the pause before the first retry (doubled each time).
const TRIES: u32 = 4;
const FIRST_PAUSE: Duration = Duration::from_millis(100);

pub(crate) struct RawClient {
    http: HttpClient,
    cred: AwsCredential,
    region: String,
    /// `http(s)://host[:port]/BUCKET` (path-style addressing).
    base: String,
    timeout: Duration,
}

/// What the server answered.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The S3 error code in the body (`<Code>...</Code>`), if any.
    pub fn code(&self) -> Option<&str> {
        let t = std::str::from_utf8(&self.body).ok()?;
        let (_, rest) = t.split_once("<Code>")?;
        Some(rest.split_once("</Code>")?.0)
    }

    /// The errno of a failed answer; EIO (logged) for what has no POSIX meaning.
    pub fn errno(&self, what: &str) -> Errno {
        match self.status {
            StatusCode::NOT_FOUND => Errno::ENOENT,
            StatusCode::PRECONDITION_FAILED | StatusCode::CONFLICT => Errno(libc::ESTALE),
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => Errno(libc::EACCES),
            s => {
                tracing::warn!(
                    "S3 {what}: HTTP {s} {}",
                    self.code().unwrap_or("(no error code)")
                );
                Errno::EIO
            }
        }
    }

    /// The first element `<tag>...</tag>` of the XML body.
    /// The ETag an upload's answer carries.
    pub fn etag(&self) -> Result<String, Errno> {
        self.headers
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| {
                tracing::warn!("S3: an upload answer without an ETag");
                Errno::EIO
            })
    }

    /// A failed answer's errno; a 2xx that carries an `<Error>` (CompleteMultipartUpload
    /// may) is a failure too.
    pub fn check(&self, what: &str) -> Result<(), Errno> {
        let error_body = self.body.windows(7).any(|w| w == b"<Error>");
        if self.status.is_success() && !error_body {
            return Ok(());
        }
        if error_body && self.status.is_success() {
            return Err(match self.code() {
                Some("PreconditionFailed") | Some("ConditionalRequestConflict") => {
                    Errno(libc::ESTALE)
                }
                Some("NoSuchKey") => Errno::ENOENT,
                c => {
                    tracing::warn!("S3 {what}: {}", c.unwrap_or("an error without a code"));
                    Errno::EIO
                }
            });
        }
        Err(self.errno(what))
    }

    pub fn xml(&self, tag: &str) -> Option<String> {
        let t = std::str::from_utf8(&self.body).ok()?;
        let (_, rest) = t.split_once(&format!("<{tag}>"))?;
        Some(unescape(rest.split_once(&format!("</{tag}>"))?.0))
    }
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&apos;", "'")
        .replace("&#34;", "\"")
        .replace("&amp;", "&")
}

impl RawClient {
    pub fn new(cfg: &S3Config, options: &ClientOptions, timeout: Duration) -> Result<Self, String> {
        let http = ReqwestConnector::default()
            .connect(options)
            .map_err(|e| format!("HTTP client: {e}"))?;
        let host = match &cfg.endpoint {
            Some(e) => e.trim_end_matches('/').to_string(),
            None => format!("https://s3.{}.amazonaws.com", cfg.region),
        };
        Ok(RawClient {
            http,
            cred: AwsCredential {
                key_id: cfg.credentials.access_key_id.clone(),
                secret_key: cfg.credentials.secret_access_key.clone(),
                token: cfg.credentials.session_token.clone(),
            },
            region: cfg.region.clone(),
            base: format!("{host}/{}", encode(&cfg.bucket)),
            timeout,
        })
    }

    /// Sends one signed request for `key` (the full key, as S3 spells it) with `query` (already
    /// encoded, without `?`), retrying what failed in transit or with a 5xx.
    pub async fn send(
        &self,
        method: Method,
        key: &str,
        query: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, Errno> {
        let mut uri = format!("{}/{}", self.base, encode(key));
        if !query.is_empty() {
            uri.push('?');
            uri.push_str(query);
        }
        let mut pause = FIRST_PAUSE;
        for attempt in 1..=TRIES {
            let mut b = http::Request::builder().method(method.clone()).uri(&uri);
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            let mut req: HttpRequest = b.body(body.clone().into()).map_err(|e| {
                tracing::error!("S3 request {method} {uri}: {e}");
                Errno::EIO
            })?;
            // The payload is not hashed (UNSIGNED-PAYLOAD): hashing every part of a large
            // upload costs CPU for nothing the TLS or the loopback does not already give.
            AwsAuthorizer::new(&self.cred, "s3", &self.region)
                .with_sign_payload(false)
                .try_authorize(&mut req, None)
                .map_err(|e| {
                    tracing::error!("S3 signing: {e}");
                    Errno::EIO
                })?;
            let sent = tokio::time::timeout(self.timeout, async {
                let r = self.http.execute(req).await?;
                let (parts, body) = r.into_parts();
                let body = body.bytes().await?;
                Ok::<_, object_store::client::HttpError>(Answer {
                    status: parts.status,
                    headers: parts.headers,
                    body,
                })
            })
            .await;
            let (retry_why, answered) = match sent {
                Ok(Ok(a)) if !a.status.is_server_error() => return Ok(a),
                Ok(Ok(a)) => (format!("HTTP {}", a.status), true),
                Ok(Err(e)) => (e.to_string(), false),
                Err(_) => (format!("no answer in {:?}", self.timeout), false),
            };
            if attempt == TRIES {
                tracing::warn!("S3 {method} {key}: {retry_why}; gave up after {TRIES} tries");
                // No answer at all: the server is gone (see errors::errno).
                return Err(if answered {
                    Errno::EIO
                } else {
                    Errno::ENOTCONN
                });
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
        Err(Errno::EIO)
    }
}

/// S3's URI encoding of a key: every byte but the unreserved ones and `/` as `%XX`.
pub(crate) fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for &b in key.as_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_as_s3_signs_them() {
        assert_eq!(encode("a/b c/ü+%.txt"), "a/b%20c/%C3%BC%2B%25.txt");
        assert_eq!(encode("dir/"), "dir/");
    }

    #[test]
    fn xml_elements_are_found_and_unescaped() {
        let a = Answer {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(
                b"<R><UploadId>x&amp;y</UploadId><ETag>&quot;abc-2&quot;</ETag></R>",
            ),
        };
        assert_eq!(a.xml("UploadId").as_deref(), Some("x&y"));
        assert_eq!(a.xml("ETag").as_deref(), Some("\"abc-2\""));
        assert_eq!(a.xml("Nope"), None);
    }
}
