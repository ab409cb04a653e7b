//! `tierfs warm PATH...` and `tierfs evict PATH...`, the client side.
//!
//! Each PATH is resolved (symlinks in it followed) to the tierfs mount that holds it; trees are
//! walked through the mount (so their metadata is cached on the way), without following
//! symlinks or crossing into other filesystems. Warm totals the bytes first (for the ETA), then
//! sends one `warm` request per regular file to the mount's daemon, `jobs` at a time; the
//! daemon reads the file from the backing store and admits it to the SSD tier. Evict sends one
//! `evict` per file, directory and symlink, and drops the kernel's cached pages of each file.

use crate::cache_cmd::request_line;
use crate::control;
use crate::progress::Progress;
use anyhow::{anyhow, bail, Context, Result};
use indicatif::HumanBytes;
use serde_json::Value;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

/// A tierfs mount some PATH is on.
struct Target {
    root: PathBuf,
    socket: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Other,
}

/// An object to send a request for.
struct Item {
    target: usize,
    rel: PathBuf,
    size: u64,
    kind: Kind,
}

/// The nearest mount point at or above `canon` (a canonical path), and whether it is tierfs.
fn mount_of(canon: &Path) -> Result<Target> {
    for anc in canon.ancestors() {
        let Some(m) = tierfs_fuse::find_mount(anc)? else {
            continue;
        };
        if m.fstype != "fuse.tierfs" {
            bail!(
                "{} is not on a tierfs mount (it is on {}, a {} mount)",
                canon.display(),
                anc.display(),
                m.fstype
            );
        }
        return Ok(Target {
            root: anc.to_path_buf(),
            socket: control::socket_for_mount(anc)?,
        });
    }
    bail!("{} is not on a tierfs mount", canon.display())
}

/// Resolves every PATH and walks it. Directories and symlinks are listed only if `all`.
/// Returns the mounts, the objects, and how many could not be walked (reported as they come).
fn collect(paths: &[PathBuf], all: bool) -> Result<(Vec<Target>, Vec<Item>, u64)> {
    let mut targets: Vec<Target> = Vec::new();
    let mut items = Vec::new();
    let mut errors = 0;
    for p in paths {
        let canon = p
            .canonicalize()
            .with_context(|| format!("{}", p.display()))?;
        let t = mount_of(&canon)?;
        let ti = match targets.iter().position(|x| x.root == t.root) {
            Some(i) => i,
            None => {
                targets.push(t);
                targets.len() - 1
            }
        };
        let root = targets[ti].root.clone();
        let walk = walkdir::WalkDir::new(&canon)
            .follow_links(false)
            .same_file_system(true);
        for e in walk {
            let e = match e {
                Ok(e) => e,
                Err(err) => {
                    eprintln!("tierfs: {err}");
                    errors += 1;
                    continue;
                }
            };
            let ft = e.file_type();
            let kind = if ft.is_file() {
                Kind::File
            } else if ft.is_dir() {
                Kind::Dir
            } else {
                Kind::Other
            };
            if kind != Kind::File && !all {
                continue;
            }
            let size = match (kind, e.metadata()) {
                (Kind::File, Ok(m)) => m.len(),
                (Kind::File, Err(err)) => {
                    eprintln!("tierfs: {err}");
                    errors += 1;
                    continue;
                }
                _ => 0,
            };
            let rel = e
                .path()
                .strip_prefix(&root)
                .map_err(|_| anyhow!("{} is outside {}", e.path().display(), root.display()))?
                .to_path_buf();
            items.push(Item {
                target: ti,
                rel,
                size,
                kind,
            });
        }
    }
    Ok((targets, items, errors))
}

/// Sends the request `line(item)` for every item, `jobs` at a time, and hands each answer
/// (in the order they come) to `each`, which returns false to stop sending more.
fn run_all(
    targets: &[Target],
    items: &[Item],
    jobs: usize,
    line: impl Fn(&Item) -> String + Sync,
    mut each: impl FnMut(&Item, Result<Value>) -> bool,
) {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..jobs.max(1) {
            let tx = tx.clone();
            let (next, stop, line) = (&next, &stop, &line);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= items.len() || stop.load(Relaxed) {
                    return;
                }
                let it = &items[i];
                let answer = control::request_patient(&targets[it.target].socket, &line(it))
                    .and_then(|a| serde_json::from_str(&a).context("daemon answered badly"));
                if tx.send((i, answer)).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        for (i, answer) in rx {
            if !each(&items[i], answer) {
                stop.store(true, Relaxed);
            }
        }
    });
}

/// The error an answer carries, and whether it is fatal (about the mount).
fn answer_error(v: &Value) -> Option<(String, bool)> {
    let e = v.get("error")?;
    let msg = e.as_str().map_or_else(|| e.to_string(), str::to_string);
    Some((msg, v["fatal"].as_bool().unwrap_or(false)))
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Notes before a warm: no SSD tier (an error), more data than the tier holds, a budget that
/// will pace the warm.
fn pre_warm_notes(targets: &[Target], total: u64, budget: bool) -> Result<()> {
    for t in targets {
        // Best effort: a daemon busy with another long request may not answer in time.
        let Ok(v) = control::request(&t.socket, &["stats"]) else {
            continue;
        };
        let ssd = &v["ssd"];
        if ssd.is_null() {
            bail!(
                "{}: this mount has no SSD tier (ssd.enable=off): nothing to warm into",
                t.root.display()
            );
        }
        let cap = n(ssd, "cap_bytes");
        if total > cap {
            eprintln!(
                "tierfs warm: warning: {} to warm but the SSD tier of {} holds at most {}: the \
                 files warmed first will be reclaimed to make room for the last",
                HumanBytes(total),
                t.root.display(),
                HumanBytes(cap)
            );
        }
        let burst = n(ssd, "cur_burst");
        if budget && total > burst {
            eprintln!(
                "tierfs warm: the SSD write budget paces this warm ({} at once, then {}/s); \
                 --no-budget overrides it",
                HumanBytes(burst),
                HumanBytes(n(ssd, "write_rate"))
            );
        }
    }
    Ok(())
}

pub fn warm(paths: &[PathBuf], budget: bool, jobs: usize) -> Result<()> {
    let (targets, items, walk_errors) = collect(paths, false)?;
    let total: u64 = items.iter().map(|i| i.size).sum();
    pre_warm_notes(&targets, total, budget)?;
    let mut progress = Progress::new("warm", items.len() as u64, total);
    let (mut admitted, mut present, mut failed) = (0u64, 0u64, 0u64);
    let mut fatal: Option<String> = None;
    run_all(
        &targets,
        &items,
        jobs,
        |it| request_line("warm", &it.rel, budget),
        |it, answer| {
            let v = match answer {
                Ok(v) => v,
                Err(e) => {
                    fatal = Some(format!("{e:#}"));
                    return false;
                }
            };
            if let Some((msg, is_fatal)) = answer_error(&v) {
                if is_fatal {
                    fatal.get_or_insert(msg);
                    return false;
                }
                progress.warn(&format!("tierfs warm: {msg}"));
                failed += 1;
            } else {
                admitted += n(&v, "admitted_bytes");
                present += n(&v, "present_bytes");
            }
            progress.file_done(it.size);
            true
        },
    );
    let took = progress.finish();
    if let Some(e) = fatal {
        bail!("{e}");
    }
    println!(
        "tierfs warm: {} files, {} in {:.1} s: {} admitted to the SSD tier, {} there already{}",
        items.len(),
        HumanBytes(total),
        took.as_secs_f64(),
        HumanBytes(admitted),
        HumanBytes(present),
        if failed > 0 {
            format!("; {failed} failed")
        } else {
            String::new()
        }
    );
    if failed + walk_errors > 0 {
        bail!(
            "{} of the files could not be warmed (see above)",
            failed + walk_errors
        );
    }
    Ok(())
}

pub fn evict(paths: &[PathBuf]) -> Result<()> {
    let (targets, items, walk_errors) = collect(paths, true)?;
    let (mut ram, mut entries, mut bytes, mut failed) = (0u64, 0u64, 0u64, 0u64);
    let mut fatal = None;
    run_all(
        &targets,
        &items,
        1,
        |it| request_line("evict", &it.rel, true),
        |it, answer| {
            let v = match answer {
                Ok(v) => v,
                Err(e) => {
                    fatal = Some(format!("{e:#}"));
                    return false;
                }
            };
            if let Some((msg, _)) = answer_error(&v) {
                eprintln!("tierfs evict: {msg}");
                failed += 1;
                return true;
            }
            ram += n(&v, "ram_blocks");
            entries += n(&v, "ssd_entries");
            bytes += n(&v, "ssd_bytes");
            if it.kind == Kind::File {
                drop_page_cache(&targets[it.target].root.join(&it.rel));
            }
            true
        },
    );
    if let Some(e) = fatal {
        bail!("{e}");
    }
    let count = |k: Kind| items.iter().filter(|i| i.kind == k).count();
    println!(
        "tierfs evict: {} files, {} directories, {} others: {entries} SSD entries ({}) and \
         {ram} RAM blocks dropped{}",
        count(Kind::File),
        count(Kind::Dir),
        count(Kind::Other),
        HumanBytes(bytes),
        if failed > 0 {
            format!("; {failed} failed")
        } else {
            String::new()
        }
    );
    if failed + walk_errors > 0 {
        bail!("{} objects could not be evicted", failed + walk_errors);
    }
    Ok(())
}

/// Drops the kernel's cached pages of a file (clean pages only): its next read reaches
/// tierfs. Best effort.
fn drop_page_cache(path: &Path) {
    if let Ok(f) = std::fs::File::open(path) {
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}
