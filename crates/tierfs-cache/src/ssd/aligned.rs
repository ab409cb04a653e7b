//! Page-aligned buffers: O_DIRECT wants the memory, the offset and the length aligned. A read
//! lands in one of these and is handed out as `Bytes::from_owner(buf).slice(..)`: no copy.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

pub(crate) const PAGE: usize = 4096;

pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to a page), page-aligned. None if memory is
    /// short: callers treat that like an I/O error rather than abort.
    pub fn new(len: usize) -> Option<AlignedBuf> {
        let len = len.max(PAGE).checked_next_multiple_of(PAGE)?;
        let layout = Layout::from_size_align(len, PAGE).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(AlignedBuf { ptr, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized (zeroed) bytes for our lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout (len is a non-zero page multiple).
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, PAGE),
            )
        }
    }
}
