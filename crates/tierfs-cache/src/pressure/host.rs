//! What the host says about its memory (/proc/meminfo), what this process holds
//! (/proc/self/statm), and handing freed memory back to the kernel.

/// A `/proc/meminfo` field in bytes (`MemAvailable`, `MemTotal`).
pub(crate) fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// (MemTotal, MemAvailable) of the host; MemAvailable is the kernel's estimate of what can be
/// allocated without swapping (free memory plus reclaimable page cache and slab), the number
/// `free(1)` shows as "available". Absent on kernels before 3.14.
pub(crate) fn meminfo() -> (Option<u64>, Option<u64>) {
    match std::fs::read_to_string("/proc/meminfo") {
        Ok(t) => (
            meminfo_field(&t, "MemTotal"),
            meminfo_field(&t, "MemAvailable"),
        ),
        Err(_) => (None, None),
    }
}

/// Resident set size of this process, bytes.
pub fn self_rss() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(4096) as u64
}

/// Gives free heap memory back to the kernel. Evicted blocks go back to the allocator, but
/// glibc keeps freed memory in its arenas (only the top of each heap is trimmed on free, and
/// 64 KiB blocks are below its mmap threshold), so RSS would not fall: malloc_trim releases
/// every free page in every arena (MADV_DONTNEED). Other allocators return memory on their
/// own; there this does nothing.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the arenas' locks itself; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes glibc use one malloc arena, unless the user chose (`MALLOC_ARENA_MAX`, or
/// `glibc.malloc.arena_max` in `GLIBC_TUNABLES`). Call before any thread is started.
///
/// Why: glibc gives threads separate arenas (up to 8 per core), and memory freed into one
/// arena is reused only by the threads of that arena. A RAM tier that churns at its cap
/// allocates blocks on some threads and frees them (evicts) on others, so every arena grows
/// to its own high-water mark: measured, a 512 MiB tier read through three times took
/// 1.8 GiB of RSS with the default arenas, 1.4 GiB with four, 551 MiB with one. The large
/// allocations that one arena serializes (a block per miss, a buffer per backing read) are
/// few per second next to the cost of the I/O behind them; small ones are served from
/// glibc's per-thread caches without the arena lock. Returns whether it was set.
pub fn one_malloc_arena() -> bool {
    let chosen = std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"));
    if chosen {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt has no memory-safety preconditions.
    return unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) } == 1;
    #[allow(unreachable_code)]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let t = "MemTotal:       24731708 kB\nMemFree:         1394472 kB\nMemAvailable:   21742548 kB\n";
        assert_eq!(meminfo_field(t, "MemTotal"), Some(24731708 * 1024));
        assert_eq!(meminfo_field(t, "MemAvailable"), Some(21742548 * 1024));
        assert_eq!(meminfo_field(t, "Mem"), None);
        assert!(self_rss() > 0);
        let (total, avail) = meminfo();
        assert!(total.unwrap() >= avail.unwrap());
    }
}
