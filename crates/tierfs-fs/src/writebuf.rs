//! Buffers for incoming write-back data, carved from 2 MiB regions backed by transparent huge
//! pages.
//!
//! Why: write-back keeps every written byte in RAM until it is flushed, so a 2 GiB write is
//! 2 GiB of fresh memory. From the allocator each 512 KiB buffer costs 128 page faults, each
//! zeroing a page and charging it to the memory cgroup: a profile of a streaming write had
//! page faults at about a fifth of the daemon's CPU, on the path the application waits on.
//! A huge-page region takes one fault per 2 MiB. The host's THP setting is usually `madvise`,
//! so the regions ask for it; where THP is off they still work, with small pages.
//!
//! Large writes only (`MIN`): a region lives until every buffer carved from it is dropped, so a
//! small buffer kept long (a file whose flush fails and is retried) could pin a whole region.
//! With buffers of at least 256 KiB a region holds at most 8, which bounds that waste to 8x
//! the data kept, and buffers of one stream are flushed and dropped in the order they came.

use bytes::Bytes;
use parking_lot::Mutex;
use std::ptr::NonNull;
use std::sync::Arc;

/// Region size: one x86-64 huge page.
const REGION: usize = 2 << 20;
/// Smaller writes use the ordinary allocator.
const MIN: usize = 256 << 10;

/// An anonymous mapping of `REGION` bytes, aligned to `REGION` so THP can back it.
struct Region {
    ptr: NonNull<u8>,
}

// SAFETY: the region is plain memory; buffers write disjoint ranges once, before sharing them.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    fn new() -> Option<Region> {
        // Map twice the size and trim, so the start is aligned whatever mmap returns.
        let len = 2 * REGION;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let base = p as usize;
        let start = (base + REGION - 1) & !(REGION - 1);
        // SAFETY: unmapping the parts of our own mapping outside [start, start + REGION).
        unsafe {
            if start > base {
                libc::munmap(p, start - base);
            }
            let end = start + REGION;
            if base + len > end {
                libc::munmap(end as *mut libc::c_void, base + len - end);
            }
            // Advisory: without THP the region is ordinary memory.
            libc::madvise(start as *mut libc::c_void, REGION, libc::MADV_HUGEPAGE);
        }
        NonNull::new(start as *mut u8).map(|ptr| Region { ptr })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and no buffer refers to it any more (they hold an Arc).
        unsafe {
            libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, REGION);
        }
    }
}

/// One buffer: `len` bytes at `off` of a region, immutable once created.
struct Chunk {
    region: Arc<Region>,
    off: usize,
    len: usize,
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: [off, off + len) is inside the region, was written before the Chunk was
        // made, and is never written again.
        unsafe { std::slice::from_raw_parts(self.region.ptr.as_ptr().add(self.off), self.len) }
    }
}

/// Hands out write buffers; the region being filled is shared by the FUSE threads.
#[derive(Default)]
pub struct WriteBufs {
    cur: Mutex<Option<(Arc<Region>, usize)>>,
}

impl WriteBufs {
    /// A copy of `data` as an immutable buffer, from a huge-page region when large enough.
    pub fn copy(&self, data: &[u8]) -> Bytes {
        let len = data.len();
        if !(MIN..=REGION).contains(&len) {
            return Bytes::copy_from_slice(data);
        }
        let (region, off) = {
            let mut g = self.cur.lock();
            let (region, off) = match g.take() {
                Some((r, off)) if off + len <= REGION => (r, off),
                _ => match Region::new() {
                    Some(r) => (Arc::new(r), 0),
                    None => return Bytes::copy_from_slice(data),
                },
            };
            // Cache-line aligned starts.
            let next = (off + len + 63) & !63;
            if next < REGION {
                *g = Some((region.clone(), next));
            }
            (region, off)
        };
        // SAFETY: [off, off + len) was handed to this call alone (under the lock above) and
        // lies inside the region; no reference to it exists yet.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), region.ptr.as_ptr().add(off), len);
        }
        Bytes::from_owner(Chunk { region, off, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_hold_their_bytes_and_regions_are_shared_and_freed() {
        let bufs = WriteBufs::default();
        let mk = |n: usize, seed: u8| -> Vec<u8> {
            (0..n)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                .collect()
        };
        let (a, b, c) = (mk(512 << 10, 1), mk(700 << 10, 2), mk(1 << 20, 3));
        let (ba, bb, bc) = (bufs.copy(&a), bufs.copy(&b), bufs.copy(&c));
        assert_eq!(&ba[..], &a[..]);
        assert_eq!(&bb[..], &b[..]);
        assert_eq!(&bc[..], &c[..]);
        // Small and oversized writes take the ordinary allocator, and are equal too.
        let (s, l) = (mk(4096, 4), mk(3 << 20, 5));
        assert_eq!(&bufs.copy(&s)[..], &s[..]);
        assert_eq!(&bufs.copy(&l)[..], &l[..]);
        // a and b share a region (512K + 700K fit in 2 MiB), c does not fit after them.
        let region_of = |x: &Bytes| (x.as_ptr() as usize) & !(REGION - 1);
        assert_eq!(region_of(&ba), region_of(&bb));
        assert_ne!(region_of(&ba), region_of(&bc));
        // Slices outlive their parent buffer.
        let tail = bb.slice(100..200);
        drop((ba, bb, bc));
        assert_eq!(&tail[..], &b[100..200]);
    }
}
