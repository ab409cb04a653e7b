//! An open for reading GETs the object's first MiB instead of HEADing it: the GET's answer
//! carries what a HEAD would (size, Last-Modified, ETag: the version the handle reads), and
//! the start of the data the reader asks for next. tierfs opens an object on the store only
//! when no tier holds its start (a cached one is checked with a HEAD and not opened), so a
//! small object read for the first time costs one request instead of a HEAD and a GET:
//! 1,000 objects of 4-64 KiB were 2 requests each, one after the other, over a 4 ms link.
//! The HEAD is here too: what the bucket says of one object, below the store (`store`).

use crate::attrs::{etag_of, key_ino, object_attr};
use crate::ctx::Ctx;
use bytes::Bytes;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};
use std::sync::Arc;
use tierfs_store::{Attr, Errno, Result};

/// How much of an object an open for reading fetches with its GET: what read-ahead's first
/// fetch asks for at least, and a small object whole.
pub(crate) const OPEN_READ: u64 = 1 << 20;

impl Ctx {
    /// The attributes of object `rel` in the bucket (HEAD), with its ETag.
    pub(crate) fn head(&self, rel: &str) -> Result<(Attr, Option<String>)> {
        let key = self.key(rel)?;
        let meta = self.run(self.client()?.s3.head(&key))?;
        let mut a = object_attr(&meta, self.owner);
        a.ino = key_ino(rel);
        Ok((a, etag_of(&meta)))
    }

    /// The attributes, ETag and first bytes (up to [`OPEN_READ`]) of object `rel`, in one
    /// GET; a HEAD instead where the GET cannot say (an empty object answers a range with 416).
    pub(crate) fn open_read(
        &self,
        rel: &Arc<str>,
    ) -> Result<(Attr, Option<String>, Option<Bytes>)> {
        let key = self.key(rel)?;
        let c = self.client()?;
        let opts = GetOptions {
            range: Some(GetRange::Bounded(0..OPEN_READ)),
            ..Default::default()
        };
        let got = self.run(async {
            let r = c.s3.get_opts(&key, opts).await?;
            let meta = r.meta.clone();
            Ok((meta, r.bytes().await?))
        });
        match got {
            Ok((meta, first)) => {
                let mut a = object_attr(&meta, self.owner);
                a.ino = key_ino(rel);
                Ok((a, etag_of(&meta), Some(first)))
            }
            Err(Errno::ENOENT) => Err(Errno::ENOENT),
            Err(_) => {
                let (a, etag) = self.head(rel)?;
                Ok((a, etag, None))
            }
        }
    }
}

/// `[offset, offset + len)` of an object of `size` bytes from its `first` bytes, as far as
/// they reach; None where they do not cover the range's start.
pub(crate) fn from_first(first: &Bytes, size: u64, offset: u64, len: usize) -> Option<Bytes> {
    let end = size.min(offset.saturating_add(len as u64));
    let have = first.len() as u64;
    if offset >= end || offset >= have {
        return None;
    }
    Some(first.slice(offset as usize..end.min(have) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_answer_what_they_cover() {
        let first = Bytes::from(vec![7u8; 100]);
        assert_eq!(from_first(&first, 100, 0, 4096).map(|b| b.len()), Some(100));
        assert_eq!(from_first(&first, 100, 10, 5).map(|b| b.len()), Some(5));
        assert_eq!(
            from_first(&first, 1000, 50, 4096).map(|b| b.len()),
            Some(50)
        );
        assert!(from_first(&first, 1000, 100, 10).is_none());
        assert!(from_first(&first, 100, 100, 10).is_none());
    }
}
