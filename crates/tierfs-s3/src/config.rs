//! Where the bucket is and who we are to it: `s3://BUCKET[/PREFIX]`, the endpoint, the region
//! and the credentials, from the places the AWS tools look (the environment, then
//! `~/.aws/credentials` and `~/.aws/config` for `AWS_PROFILE` or `default`).
//!
//! object_store reads only the environment; the shared files are a small INI format read here
//! (profiles, `key = value` lines, `#`/`;` comments), which is all the credentials and region
//! keys need.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A bucket and the part of it mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// Key prefix without leading or trailing `/` ("" = the whole bucket).
    pub prefix: String,
    /// `http(s)://host[:port]` of an S3-compatible server; None = AWS for `region`.
    pub endpoint: Option<String>,
    pub region: String,
    pub credentials: Credentials,
}

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Where they came from, for the log (never the secret itself).
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Credentials({}, from {})",
            self.access_key_id, self.source
        )
    }
}

/// `s3://BUCKET[/PREFIX]` -> (bucket, prefix); None if `s` is not an s3:// URL.
pub fn parse_url(s: &str) -> Option<Result<(String, String), String>> {
    let rest = s.strip_prefix("s3://")?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if !valid_bucket(bucket) {
        return Some(Err(format!(
            "{s}: '{bucket}' is not a bucket name (3-63 lowercase letters, digits, '.', '-')"
        )));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|c| c == "." || c == "..") || prefix.contains("//") {
        return Some(Err(format!(
            "{s}: the prefix may not hold '.', '..' or '//'"
        )));
    }
    Some(Ok((bucket.to_string(), prefix.to_string())))
}

fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && !b.starts_with(['.', '-'])
        && !b.ends_with(['.', '-'])
}

impl S3Config {
    /// The configuration for `url`, with `endpoint` and `region` from options where given,
    /// else from the environment and the AWS shared files; credentials likewise.
    pub fn resolve(
        url: &str,
        endpoint: Option<String>,
        region: Option<String>,
    ) -> Result<S3Config, String> {
        let (bucket, prefix) =
            parse_url(url).ok_or_else(|| format!("{url}: not an s3:// URL"))??;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home = env("HOME").map(PathBuf::from);
        let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let files = SharedFiles::read(home.as_deref(), &profile);
        let endpoint = endpoint
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .or_else(|| files.config.get("endpoint_url").cloned())
            .map(|e| e.trim_end_matches('/').to_string());
        if let Some(e) = &endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(format!("endpoint {e}: must start with http:// or https://"));
            }
        }
        let region = region
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| files.config.get("region").cloned())
            .unwrap_or_else(|| "us-east-1".into());
        let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => Credentials {
                access_key_id: id,
                secret_access_key: secret,
                session_token: env("AWS_SESSION_TOKEN"),
                source: "the environment (AWS_ACCESS_KEY_ID)".into(),
            },
            _ => files.credentials(&profile)?,
        };
        Ok(S3Config {
            bucket,
            prefix,
            endpoint,
            region,
            credentials,
        })
    }
}

/// The profile's sections of `~/.aws/credentials` and `~/.aws/config` (the latter names
/// profiles `[profile NAME]`, except `[default]`). `AWS_SHARED_CREDENTIALS_FILE` and
/// `AWS_CONFIG_FILE` move them, as for the AWS CLI.
struct SharedFiles {
    credentials: HashMap<String, String>,
    config: HashMap<String, String>,
    credentials_path: Option<PathBuf>,
}

impl SharedFiles {
    fn read(home: Option<&Path>, profile: &str) -> SharedFiles {
        let path = |var: &str, name: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join(".aws").join(name)))
        };
        let credentials_path = path("AWS_SHARED_CREDENTIALS_FILE", "credentials");
        let config_path = path("AWS_CONFIG_FILE", "config");
        let section = |p: &Option<PathBuf>, name: &str| {
            p.as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .map(|text| ini_section(&text, name))
                .unwrap_or_default()
        };
        let config_name = if profile == "default" {
            "default".to_string()
        } else {
            format!("profile {profile}")
        };
        SharedFiles {
            credentials: section(&credentials_path, profile),
            config: section(&config_path, &config_name),
            credentials_path,
        }
    }

    fn credentials(&self, profile: &str) -> Result<Credentials, String> {
        let get = |k: &str| {
            self.credentials
                .get(k)
                .or_else(|| self.config.get(k))
                .cloned()
        };
        match (get("aws_access_key_id"), get("aws_secret_access_key")) {
            (Some(id), Some(secret)) => Ok(Credentials {
                access_key_id: id,
                secret_access_key: secret,
                session_token: get("aws_session_token"),
                source: format!(
                    "profile '{profile}' of {}",
                    self.credentials_path
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "~/.aws/credentials".into())
                ),
            }),
            _ => Err(format!(
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give \
                 profile '{profile}' aws_access_key_id and aws_secret_access_key in {}",
                self.credentials_path
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "~/.aws/credentials".into())
            )),
        }
    }
}

/// The `key = value` pairs of section `[name]` of an INI text (keys lowercased).
fn ini_section(text: &str, name: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = h.trim() == name;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(parse_url("/mnt/x"), None);
        assert_eq!(
            parse_url("s3://data").unwrap().unwrap(),
            ("data".into(), "".into())
        );
        assert_eq!(
            parse_url("s3://data/a/b/").unwrap().unwrap(),
            ("data".into(), "a/b".into())
        );
        assert!(parse_url("s3://Data").unwrap().is_err());
        assert!(parse_url("s3://ab").unwrap().is_err());
        assert!(parse_url("s3://data/a/../b").unwrap().is_err());
    }

    #[test]
    fn ini_profiles() {
        let t = "[default]\naws_access_key_id = A\n# c\n[profile x]\nregion=eu-west-1\n[x]\nAWS_SECRET_ACCESS_KEY = S\n";
        assert_eq!(ini_section(t, "default")["aws_access_key_id"], "A");
        assert_eq!(ini_section(t, "profile x")["region"], "eu-west-1");
        assert_eq!(ini_section(t, "x")["aws_secret_access_key"], "S");
        assert!(ini_section(t, "y").is_empty());
    }

    #[test]
    fn credentials_from_a_profile_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(".aws")).unwrap();
        std::fs::write(
            dir.path().join(".aws/credentials"),
            "[default]\naws_access_key_id=K\naws_secret_access_key=S\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join(".aws/config"),
            "[default]\nregion = eu-north-1\n",
        )
        .unwrap();
        let f = SharedFiles::read(Some(dir.path()), "default");
        let c = f.credentials("default").unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.secret_access_key.as_str()),
            ("K", "S")
        );
        assert_eq!(f.config["region"], "eu-north-1");
        let none = SharedFiles::read(Some(dir.path()), "other");
        assert!(none
            .credentials("other")
            .unwrap_err()
            .contains("profile 'other'"));
    }
}
