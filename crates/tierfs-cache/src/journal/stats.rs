//! Counters of the journal (see `tierfs stats`).

/// A snapshot of the journal's counters and gauges.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JournalStats {
    /// Bytes of live segment files (whole segments: they are preallocated).
    pub used_bytes: u64,
    pub cap_bytes: u64,
    pub segments: u64,
    /// Records appended since open (DATA, DONE, DROP; not the writer's SEALs).
    pub records_appended: u64,
    pub bytes_appended: u64,
    /// fdatasyncs of segment files.
    pub syncs: u64,
    /// Calls to `sync`/`sync_all` that had to wait for the disk. With group commit, `syncs` is
    /// lower: one fdatasync answers every caller waiting at the time.
    pub sync_calls: u64,
    /// Most records made durable by one fdatasync.
    pub group_commit_max_batch: u64,
    /// Most writes issued between two fdatasyncs (one per batch the writer drained).
    pub group_commit_max_writes: u64,
    /// Segments deleted because every DATA record in them was covered by DONE or DROP.
    pub segments_freed: u64,
    /// Appends refused with `Full`.
    pub full_errors: u64,
    /// Appends refused with `NoSpace`: the cache device had no room for the next segment.
    #[serde(default)]
    pub no_space_errors: u64,
    /// Failed attempts to create a segment file (ENOSPC, EDQUOT, ...).
    #[serde(default)]
    pub create_failures: u64,
    /// 1 while the last attempt to create the next segment failed (the journal takes no data
    /// beyond its current segment until space returns).
    #[serde(default)]
    pub no_space: u64,
    /// At open: 1 if the last segment ended in a torn or garbled record (a crash mid-write).
    pub torn_tails: u64,
    /// At open: DATA records not covered by DONE/DROP, handed to the caller, and their bytes.
    pub replayed_records: u64,
    pub replayed_bytes: u64,
    /// First seq of the oldest live segment (0 if none).
    pub oldest_seq: u64,
    /// Every record with seq <= this is durable.
    pub durable_seq: u64,
    /// The last seq handed out.
    pub appended_seq: u64,
    /// Every record with seq <= this is written to its segment file (in the page cache: it
    /// survives the daemon's crash, not the machine's, until `durable_seq` covers it).
    #[serde(default)]
    pub written_seq: u64,
}

/// The counters behind [`JournalStats`], kept under the journal's state lock (every event that
/// moves them holds it anyway).
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub records_appended: u64,
    pub bytes_appended: u64,
    pub syncs: u64,
    pub sync_calls: u64,
    pub group_commit_max_batch: u64,
    pub group_commit_max_writes: u64,
    pub segments_freed: u64,
    pub full_errors: u64,
    pub no_space_errors: u64,
    pub torn_tails: u64,
    pub replayed_records: u64,
    pub replayed_bytes: u64,
}
