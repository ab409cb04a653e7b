//! The one writer thread's state and the messages it takes: it packs admitted entries into
//! clusters, writes each cluster with one O_DIRECT write at the end of the current segment,
//! then publishes its entries in the index; it also starts segments (reclaiming the oldest
//! when over the cap), and writes checkpoints. The thread's work is in the modules above
//! this one: `writer_loop` (messages, timers, checkpoints), `writer_pack` (clusters packed,
//! written and published), `writer_segments` (segments started, reclaimed, given back).

use super::aligned::AlignedBuf;
use super::index::Loc;
use super::recover::{Recovered, SegInfo};
use super::segment::Segment;
use super::{Shared, SsdError, SsdKey};
use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

pub(crate) enum Msg {
    Put {
        key: SsdKey,
        version: u64,
        data: Bytes,
        /// The estimated cost (`budget::charge`).
        charge: u64,
        /// The charge was taken from the write budget (false: `offer_wait` without budget,
        /// whose bytes the bucket never pays for).
        budgeted: bool,
    },
    Remove(SsdKey),
    Flush(Sender<()>),
    Checkpoint(Sender<Result<(), SsdError>>),
    /// Answers whether the index is durable: the final checkpoint written (or not needed).
    Shutdown(Sender<bool>),
    /// Give back up to this many bytes of the device (the journal needs room): drop the oldest
    /// segments, hot entries included; answers the bytes freed.
    Yield(u64, Sender<u64>),
}

pub(super) enum Kind {
    Put,
    /// A hit entry rewritten from a reclaimed segment; it replaces the entry at `Loc` only if
    /// the index still holds that one.
    Reinsert(Loc),
    Tombstone,
}

pub(super) struct Item {
    pub(super) key: SsdKey,
    pub(super) version: u64,
    pub(super) len: u32,
    pub(super) data_off: u32,
    pub(super) charge: u64,
    pub(super) budgeted: bool,
    pub(super) crcs: Arc<[u32]>,
    pub(super) kind: Kind,
}

pub(crate) struct Writer {
    pub(super) sh: Arc<Shared>,
    pub(super) rx: Receiver<Msg>,
    /// The open cluster: header + records, and the data area, written with one pwritev.
    /// Each buffer is `cluster_size` bytes.
    pub(super) sum: AlignedBuf,
    pub(super) data: AlignedBuf,
    pub(super) items: Vec<Item>,
    pub(super) records_len: usize,
    pub(super) data_end: u64,
    pub(super) opened: Option<Instant>,
    pub(super) segs: BTreeMap<u64, SegInfo>,
    pub(super) cur: Option<Arc<Segment>>,
    pub(super) cur_off: u64,
    pub(super) next_seq: u64,
    /// Segments written since the last checkpoint: synced before the next one.
    pub(super) dirty: Vec<Arc<Segment>>,
    pub(super) reinserts: VecDeque<(SsdKey, Loc)>,
    pub(super) last_cp: Instant,
    pub(super) last_full_check: Instant,
    pub(super) changed: bool,
    pub(super) scratch: Vec<u32>,
}

impl Writer {
    /// None if the cluster buffers cannot be allocated.
    pub fn new(sh: Arc<Shared>, rx: Receiver<Msg>, rec: Recovered) -> Option<Writer> {
        let cs = sh.cfg.cluster_size as usize;
        Some(Writer {
            sum: AlignedBuf::new(cs)?,
            data: AlignedBuf::new(cs)?,
            sh,
            rx,
            items: Vec::new(),
            records_len: 0,
            data_end: 0,
            opened: None,
            segs: rec.segs,
            cur: None,
            cur_off: 0,
            next_seq: rec.next_seq,
            changed: !rec.clean,
            dirty: Vec::new(),
            reinserts: VecDeque::new(),
            last_cp: Instant::now(),
            last_full_check: Instant::now(),
            scratch: Vec::new(),
        })
    }
}
