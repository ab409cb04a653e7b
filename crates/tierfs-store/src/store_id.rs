//! Store identities: the names that scope a store's caches on disk (the default cache
//! directory, the SSD tier's stamp), readable and stable across versions of tierfs.

/// `name` as a slug (lowercase ASCII letters and digits, other runs as one `-`, its last 40
/// characters) plus a hash of `identity`, e.g. `mnt-nfs-data-5f2c0e1a9d3b7c44`. The slug is
/// for people; the hash tells stores apart (what it covers is the caller's choice: a path, or
/// an endpoint, bucket and prefix).
pub fn readable_id(name: &str, identity: &str) -> String {
    let mut slug: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while slug.contains("--") {
        slug = slug.replace("--", "-");
    }
    let slug = slug.trim_matches('-');
    // ASCII only by now: byte offsets are character offsets.
    let slug = slug[slug.len().saturating_sub(40)..].trim_start_matches('-');
    // FNV-1a: stable across Rust versions, unlike std's hasher.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in identity.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    let slug = if slug.is_empty() { "root" } else { slug };
    format!("{slug}-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::readable_id;

    #[test]
    fn slugs_and_hashes() {
        assert_eq!(
            readable_id("/mnt/nfs/data", "/mnt/nfs/data"),
            format!("mnt-nfs-data-{}", &readable_id("", "/mnt/nfs/data")[5..])
        );
        assert!(readable_id("/", "/").starts_with("root-"));
        // Any text, any length: never a panic, always a file name.
        let id = readable_id(&"ü/ß x".repeat(30), "x");
        assert!(
            id.len() <= 40 + 17 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "{id}"
        );
        assert_ne!(readable_id("a", "1"), readable_id("a", "2"));
    }
}
