//! The shared tier in the read path: blocks neither RAM nor the SSD tier hold are looked for
//! there, a chunk at a time (`shared.chunk`, MiB), before the store is asked; a chunk it
//! lacks is read whole from the store and uploaded in the background for the other hosts.
//!
//! Only versions that can be named for good take this path: a fingerprint our own write left
//! unconfirmed, or one young enough to be racy (see `version::racy`), is read from the store
//! as without a shared tier, and nothing of it is uploaded. A chunk is keyed by the object's
//! identity and that fingerprint, and checked against both when it comes back, so a chunk of
//! another version is never served (see `tierfs_cache::shared`).

use super::seq_gate::Ticket;
use super::{FetchError, FetchResult, Objects, OpenFile};
use crate::file_state::FileState;
use crate::meta_codec::version_of;
use crate::stats::FsStats;
use crate::version::{racy, Version};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tierfs_cache::{
    BlockKey, ChunkName, ChunkSource, Claim, FlightGuard, SharedCache, SsdCache, SsdKey, Waiter,
    KIND_DATA,
};
use tierfs_store::{Fingerprint, Store};

/// This reader's part in loading one chunk: it leads the load (with the chunk's data if RAM
/// already holds all of it), or waits for another reader's.
enum Role<'f> {
    Lead(
        FlightGuard<'f, (u64, ChunkName), FetchResult>,
        Option<Bytes>,
    ),
    Follow(Waiter<FetchResult>),
}

impl<S: Store> Objects<S> {
    /// The shared tier, if the mount has one and version `v` may be read from it.
    pub(crate) fn shared_tier_for(&self, v: &Version) -> Option<&Arc<SharedCache>> {
        self.sh.shared_tier.get().filter(|_| !racy(&v.fp))
    }

    /// A read-only open of a file that neither RAM nor the SSD tier holds: the shared tier is
    /// asked for the first chunk of the version the file was last seen at (a lookup's or a
    /// listing's), and what it gives goes to the RAM and SSD tiers. The open is then a
    /// close-to-open check of the origin (no data) and its reads are served from the tiers;
    /// without this the open is an origin open, over S3 a GET of the object's first MiB that
    /// a read served by the shared tier never uses (hosts 2 and 3 of the fleet bench made
    /// 2,014 of them, 20 ms each, their bytes read from the origin for nothing). If the check
    /// finds another version, the chunk belongs to the old one and is never served for the
    /// new. False when there is no tier or it lacks the chunk: the open goes to the origin.
    pub(crate) fn start_from_shared(&self, st: &FileState) -> bool {
        let v = st.version();
        let Some(tier) = self.shared_tier_for(&v) else {
            return false;
        };
        let fp = &v.fp;
        let name = tier.name(st.id(), fp.size, fp.mtime_ns, fp.ctime_ns, 0);
        let Some(data) = tier.get_many(&[name]).pop().flatten() else {
            return false;
        };
        let (start, end) = name.range();
        if data.len() as u64 != end - start {
            return false;
        }
        // As a read's fetch does: under the file's lock, and only if the version is still
        // the one asked for. Our own write (another descriptor's) that landed during the GET
        // patched the cached blocks of this generation and moved the fingerprint; the chunk,
        // of the version before it, must not replace those blocks.
        let _r = st.rw.read();
        let now = st.version();
        if now.gen != v.gen || now.fp != v.fp || st.has_dirty.load(Relaxed) {
            return false;
        }
        let bs = self.sh.cfg.block_size;
        let (dev, ino) = st.id();
        FsStats::add(&self.sh.stats.shared_blocks, self.blocks_in(&data));
        for (i, b) in data.chunks(bs as usize).enumerate() {
            let key = BlockKey {
                gen: v.gen,
                idx: start / bs + i as u64,
            };
            if self.sh.cache.peek(&key).is_some() {
                continue;
            }
            let idx = key.idx;
            // One allocation per block, so evicting one block frees its memory.
            let block = Bytes::copy_from_slice(b);
            self.sh.cache.insert(key, block.clone());
            if let Some(ssd) = &self.sh.ssd {
                let key = SsdKey {
                    kind: KIND_DATA,
                    dev,
                    ino,
                    idx,
                };
                ssd.offer(key, version_of(fp), block);
            }
        }
        true
    }

    /// The name of the chunk holding block `idx` of `of` in version `v`.
    fn chunk_of(&self, tier: &SharedCache, of: &OpenFile<S>, v: &Version, idx: u64) -> ChunkName {
        let per = tier.config().chunk_size as u64 / self.sh.cfg.block_size;
        let fp = &v.fp;
        tier.name(of.state.id(), fp.size, fp.mtime_ns, fp.ctime_ns, idx / per)
    }

    /// Completes every claim in `leaders` (sorted): from the shared tier where it holds their
    /// chunk, else by reading the whole chunk from the store (then uploaded). One load per
    /// chunk at a time: a reader needing a chunk another is loading waits for its data.
    /// Chunks are claimed and completed in order, so two readers that wait for each other's
    /// chunks cannot wait in a circle.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load_through_shared<'a>(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        tier: &SharedCache,
        leaders: Vec<FlightGuard<'a, BlockKey, FetchResult>>,
        readahead: bool,
        mut ticket: Option<Ticket<'_>>,
        out: &mut Vec<(u64, Bytes)>,
    ) -> std::result::Result<(), FetchError> {
        // The claims grouped by chunk, in order, and each chunk's load led or waited for.
        let mut groups: Vec<(ChunkName, Vec<FlightGuard<'a, BlockKey, FetchResult>>)> = Vec::new();
        for g in leaders {
            let name = self.chunk_of(tier, of, v, g.key().idx);
            match groups.last_mut() {
                Some((n, gs)) if *n == name => gs.push(g),
                _ => groups.push((name, vec![g])),
            }
        }
        // Claimed in order; a chunk whose blocks another load just put in RAM is taken from
        // there (its load ended between our look into RAM and this claim).
        let roles: Vec<_> = groups
            .iter()
            .map(|(n, _)| match self.chunk_flights.claim((v.gen, *n)) {
                Claim::Leader(f) => {
                    let in_ram = self.chunk_from_ram(of, v, n);
                    Role::Lead(f, in_ram)
                }
                Claim::Follower(w) => Role::Follow(w),
            })
            .collect();
        let asked: Vec<ChunkName> = groups
            .iter()
            .zip(&roles)
            .filter(|(_, r)| matches!(r, Role::Lead(_, None)))
            .map(|((n, _), _)| *n)
            .collect();
        let mut found = tier.get_many(&asked).into_iter();
        let mut result: std::result::Result<(), FetchError> = Ok(());
        for ((name, guards), role) in groups.into_iter().zip(roles) {
            let (loaded, flight) = match role {
                Role::Follow(w) => (w.wait().map(|d| (d, false)), None),
                Role::Lead(f, Some(d)) => (Ok((d, false)), Some(f)),
                Role::Lead(f, None) => {
                    let r = match (&result, found.next().flatten()) {
                        (Err(e), _) => Err(e.clone()),
                        (Ok(()), Some(data)) => {
                            FsStats::add(&self.sh.stats.shared_blocks, self.blocks_in(&data));
                            Ok((data, true))
                        }
                        (Ok(()), None) => {
                            let (start, end) = name.range();
                            self.read_checked(of, v, start, end, readahead, ticket.take())
                                .inspect(|(data, cacheable)| {
                                    self.count_fetched(readahead, self.blocks_in(data));
                                    if *cacheable {
                                        tier.offer(name, data.clone());
                                    }
                                })
                        }
                    };
                    (r, Some(f))
                }
            };
            // The blocks go to RAM before the chunk's load is declared done, so a reader
            // arriving after finds them there.
            match &loaded {
                Ok((data, keep)) => self.serve_chunk(of, v, &name, data, guards, *keep, out),
                Err(e) => {
                    for g in guards {
                        g.complete(Err(e.clone()));
                    }
                    result = Err(e.clone());
                }
            }
            if let Some(f) = flight {
                f.complete(loaded.map(|(d, _)| d));
            }
        }
        result
    }

    /// Chunk `name` of version `v` assembled from the RAM tier, if every block of it is there.
    fn chunk_from_ram(&self, of: &OpenFile<S>, v: &Version, name: &ChunkName) -> Option<Bytes> {
        let bs = self.sh.cfg.block_size;
        let (start, end) = name.range();
        let mut data = Vec::with_capacity((end - start) as usize);
        for idx in start / bs..end.div_ceil(bs) {
            let b = self.sh.cache.peek(&self.key(of, v.gen, idx))?;
            if b.len() as u64 != self.block_len(v, idx) {
                return None;
            }
            data.extend_from_slice(&b);
        }
        Some(data.into())
    }

    fn blocks_in(&self, data: &Bytes) -> u64 {
        (data.len() as u64).div_ceil(self.sh.cfg.block_size)
    }

    /// Hands out the blocks of chunk `name` (its `data`, of version `v`): the claimed ones to
    /// their waiters and `out`; with `keep`, all of them to the RAM and SSD tiers (a chunk is
    /// read whole, so its other blocks are there for the next reads).
    #[allow(clippy::too_many_arguments)]
    fn serve_chunk(
        &self,
        of: &OpenFile<S>,
        v: &Version,
        name: &ChunkName,
        data: &Bytes,
        guards: Vec<FlightGuard<'_, BlockKey, FetchResult>>,
        keep: bool,
        out: &mut Vec<(u64, Bytes)>,
    ) {
        let bs = self.sh.cfg.block_size;
        let first = name.range().0 / bs;
        let blocks = (data.len() as u64).div_ceil(bs);
        let mut guards = guards.into_iter().peekable();
        for i in 0..blocks {
            let idx = first + i;
            let (s, e) = ((i * bs) as usize, (((i + 1) * bs) as usize).min(data.len()));
            let key = self.key(of, v.gen, idx);
            let claimed = guards.next_if(|g| g.key().idx == idx);
            if claimed.is_none() && (!keep || self.sh.cache.peek(&key).is_some()) {
                continue;
            }
            // One allocation per block, so evicting one block frees its memory.
            let block = Bytes::copy_from_slice(&data[s..e]);
            if keep {
                self.keep_block(of, v, key, &block, false);
            }
            if let Some(g) = claimed {
                g.complete(Ok(block.clone()));
                out.push((idx, block));
            }
        }
        // A claim past the data (the file is shorter than its fingerprint says: cannot be,
        // the fingerprint names the size) gets what a short read gets.
        for g in guards {
            g.complete(Err(FetchError::Stale));
        }
    }
}

/// Late uploads read chunks back from the SSD tier, whose keys (the object's identity and
/// version, the block's index) a chunk's name holds: see `tierfs_cache::shared::ChunkSource`.
pub(crate) struct SsdChunks {
    pub ssd: Arc<SsdCache>,
    pub block_size: u64,
}

impl ChunkSource for SsdChunks {
    fn chunk(&self, name: &ChunkName) -> Option<Bytes> {
        let bs = self.block_size;
        let (start, end) = name.range();
        let keys: Vec<SsdKey> = (start / bs..end.div_ceil(bs))
            .map(|idx| SsdKey {
                kind: KIND_DATA,
                dev: name.ident.0,
                ino: name.ident.1,
                idx,
            })
            .collect();
        let fp = Fingerprint {
            size: name.size,
            mtime_ns: name.mtime_ns,
            ctime_ns: name.ctime_ns,
        };
        let mut data = Vec::with_capacity((end - start) as usize);
        for (i, b) in self
            .ssd
            .get_many(&keys, version_of(&fp))
            .into_iter()
            .enumerate()
        {
            let b = b?;
            let idx = start / bs + i as u64;
            if b.len() as u64 != (end - idx * bs).min(bs) {
                return None;
            }
            data.extend_from_slice(&b);
        }
        Some(data.into())
    }
}
