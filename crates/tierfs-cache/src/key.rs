/// The key of a cached block.
///
/// `gen` names one version of one backing file's contents. The file layer draws a fresh `gen`
/// whenever the backing file's fingerprint (size, mtime, ctime) changes behind our back, so
/// blocks of an old version become unreachable at once and no read can mix two versions. It is
/// kept per backing identity, not per kernel inode, so cached blocks outlive the kernel
/// forgetting a file, and renames. tierfs's own writes update the blocks they touch in place
/// and keep `gen`, so a small write does not throw away a large cached file. `gen` is unique
/// across all files of a mount, so it is the whole name of a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub gen: u64,
    /// Block index: byte offset / block size.
    pub idx: u64,
}

impl BlockKey {
    /// A fast, well-mixed hash for shard selection.
    pub(crate) fn mix(&self) -> u64 {
        let mut h = self.gen.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= self
            .idx
            .wrapping_add(0x632B_E59B_D9B4_E019)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^ (h >> 31)
    }
}
