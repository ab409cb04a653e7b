//! Issue 15, point 2: write-back of namespace operations survives `kill -9`.
//!
//! 100 rounds (`TIERFS_CRASH_ROUNDS=N` for more: `bench/crash-rounds`) over one BACKING and
//! cache dir, with `-o writeback.mode=back` (namespace write-back on, the default): a writer
//! thread works through the mount like an untar with second thoughts (mkdir, create + write + chmod + utimens, appends, rewrites (open
//! O_TRUNC), renames within and across directories, saves (a new file renamed over one in
//! its directory), unlinks, chmods, symlinks, git's loose
//! objects (a temporary name linked to the final one, then unlinked), fsync of files and of
//! directories, each fsync recorded), the daemon is `kill -9`ed at a random moment, the mount
//! comes back (replay), and:
//!
//! - the tree is one the application could have seen: its names (directories and files)
//!   are exactly those after some prefix of the writer's operations, no shorter than the last
//!   acknowledged fsync (everything deferred before an fsync is on the store when it returns);
//! - every file whose last write was followed by an acknowledged fsync of it holds those bytes,
//!   under the name the prefix gives it; every mode set before the last acknowledged fsync is
//!   there;
//! - `journal/lost/` stays empty (no conflict is staged: nothing else writes the store);
//! - what the mount serves after replay equals BACKING after a clean unmount.
//!
//! `TIERFS_WB_SEED=<hex>` replays a run. `TIERFS_WB_INJECT_LOSS=1` removes, after each kill,
//! a file an fsync made durable: the test must then fail (it can).

mod common;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TMP: &str = "/var/tmp";
/// Rounds in CI; `TIERFS_CRASH_ROUNDS=N` runs more (`bench/crash-rounds`: the long run).
fn rounds() -> usize {
    std::env::var("TIERFS_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

fn seed() -> u64 {
    let seed = match std::env::var("TIERFS_WB_SEED") {
        Ok(s) => u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("TIERFS_WB_SEED: hex"),
        Err(_) => mix(SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            ^ ((std::process::id() as u64) << 32)),
    };
    println!("ns_crash: seed {seed:#018x} (replay: TIERFS_WB_SEED={seed:x})");
    seed
}

/// One object of the model: a directory, or a file with its contents and mode.
#[derive(Clone, Debug)]
struct Obj {
    dir: bool,
    data: Vec<u8>,
    mode: u32,
    /// The contents an acknowledged fsync of this file made durable, while no write came after.
    synced: Option<Vec<u8>>,
    /// A chmod after the last acknowledged fsync (of anything): the mode is not guaranteed.
    mode_loose: bool,
    /// A symlink's target (dangling: nothing reads through it).
    link: Option<String>,
}

/// How [`read_tree`] shows a symlink: its target behind an arrow, mode 0.
fn shown_link(target: &str) -> Vec<u8> {
    format!("->{target}").into_bytes()
}

/// An operation as it changes the names: applied to a name -> object map.
#[derive(Clone, Debug)]
enum NsOp {
    Add(String, u64),
    Remove(String),
    Move(String, String),
}

/// What the writer did: objects by id, and the names after each namespace operation.
#[derive(Default, Clone)]
struct Model {
    objs: BTreeMap<u64, Obj>,
    /// The names before the first operation of this round.
    start: BTreeMap<String, u64>,
    ops: Vec<NsOp>,
    /// Operations before this index were done before an fsync that was acknowledged.
    barrier: usize,
    next_id: u64,
    /// The names after every operation so far (kept as they are made: the writer asks for
    /// them at each step).
    cur: BTreeMap<String, u64>,
}

fn apply(n: &mut BTreeMap<String, u64>, op: &NsOp) {
    match op {
        NsOp::Add(p, id) => {
            n.insert(p.clone(), *id);
        }
        NsOp::Remove(p) => {
            n.remove(p);
        }
        NsOp::Move(a, b) => {
            if let Some(id) = n.remove(a) {
                n.insert(b.clone(), id);
            }
        }
    }
}

impl Model {
    /// A new object of the model: its id.
    fn add(&mut self, obj: Obj) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.objs.insert(id, obj);
        id
    }

    fn names_at(&self, k: usize) -> BTreeMap<String, u64> {
        let mut n = self.start.clone();
        for op in &self.ops[..k] {
            apply(&mut n, op);
        }
        n
    }

    fn push(&mut self, op: NsOp) {
        apply(&mut self.cur, &op);
        self.ops.push(op);
    }

    fn current(&self) -> BTreeMap<String, u64> {
        self.cur.clone()
    }
}

/// What the tree holds: path -> Some(contents, mode) for a file (a symlink as
/// [`shown_link`], mode 0), None for a directory.
type Tree = BTreeMap<String, Option<(Vec<u8>, u32)>>;

fn read_tree(root: &Path) -> Tree {
    fn walk(root: &Path, rel: &str, out: &mut Tree) {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound && rel.is_empty() => return,
            Err(e) => panic!("read_dir {}: {e}", dir.display()),
        };
        for e in rd {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let p = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                out.insert(p.clone(), None);
                walk(root, &p, out);
            } else if md.file_type().is_symlink() {
                let t = std::fs::read_link(e.path()).unwrap();
                out.insert(p, Some((shown_link(&t.to_string_lossy()), 0)));
            } else {
                let data = std::fs::read(e.path())
                    .unwrap_or_else(|er| panic!("read {}: {er}", e.path().display()));
                out.insert(p, Some((data, md.permissions().mode() & 0o7777)));
            }
        }
    }
    let mut t = Tree::new();
    walk(root, "", &mut t);
    t
}

/// What happened to object `id`'s names in the round (for a failure's message).
fn history(m: &Model, id: u64) -> Vec<String> {
    let mut n = m.start.clone();
    let mut out = vec![format!(
        "start names: {:?}",
        n.iter().filter(|(_, i)| **i == id).collect::<Vec<_>>()
    )];
    for (k, op) in m.ops.iter().enumerate() {
        let touches = match op {
            NsOp::Add(_, i) => *i == id,
            NsOp::Remove(x) | NsOp::Move(x, _) => n.get(x) == Some(&id),
        };
        if touches {
            out.push(format!("{k}:{op:?}"));
        }
        apply(&mut n, op);
    }
    out
}

/// Checks `got` against the model (see the module comment); Ok(the prefix it matched).
fn check(m: &Model, got: &Tree) -> Result<usize, String> {
    let names: BTreeSet<&String> = got.keys().collect();
    // The names after each prefix from the barrier on, made one operation at a time.
    let mut prefixes = Vec::with_capacity(m.ops.len() + 1 - m.barrier);
    let mut at = m.names_at(m.barrier);
    prefixes.push(at.clone());
    for op in &m.ops[m.barrier..] {
        apply(&mut at, op);
        prefixes.push(at.clone());
    }
    for k in (m.barrier..=m.ops.len()).rev() {
        let at = &prefixes[k - m.barrier];
        if at.len() != names.len() || !at.keys().zip(&names).all(|(a, b)| a == *b) {
            continue;
        }
        for (p, id) in at {
            let o = &m.objs[id];
            match (&got[p], o.dir) {
                (None, true) => {}
                (Some((data, _)), false) if o.link.is_some() => {
                    let want = shown_link(o.link.as_deref().unwrap_or_default());
                    if *data != want {
                        return Err(format!(
                            "{p}: {:?}, not the symlink {:?}",
                            String::from_utf8_lossy(data),
                            String::from_utf8_lossy(&want)
                        ));
                    }
                }
                (Some((data, mode)), false) => {
                    if let Some(s) = &o.synced {
                        if data != s {
                            let hist = history(m, *id);
                            let other: Vec<u64> = m
                                .objs
                                .iter()
                                .filter(|(_, x)| x.data == *data || x.synced.as_ref() == Some(data))
                                .map(|(i, _)| *i)
                                .collect();
                            return Err(format!(
                                "{p}: {} bytes, not the {} bytes an fsync made durable (first difference at {:?}); id {id} barrier {} k {k} hist {hist:?} same data as {other:?}",
                                data.len(),
                                s.len(),
                                data.iter().zip(s).position(|(a, b)| a != b),
                                m.barrier
                            ));
                        }
                    }
                    if !o.mode_loose && *mode != o.mode {
                        let hist = history(m, *id);
                        return Err(format!(
                            "{p}: mode {mode:o}, set {:o} before an fsync; id {id} barrier {} k {k} ops {hist:?}",
                            o.mode, m.barrier
                        ));
                    }
                }
                _ => return Err(format!("{p}: a directory and a file swapped")),
            }
        }
        return Ok(k);
    }
    // The closest prefix, to say what differs.
    let diff = |k: usize| {
        let want = m.names_at(k);
        let extra: Vec<String> = names
            .iter()
            .filter(|n| !want.contains_key(**n))
            .map(|n| n.to_string())
            .collect();
        let missing: Vec<String> = want
            .keys()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect();
        (extra, missing)
    };
    let best = (0..=m.ops.len())
        .min_by_key(|&k| {
            let (e, mi) = diff(k);
            e.len() + mi.len()
        })
        .unwrap_or(0);
    let (extra, missing) = diff(best);
    // Where the missing names' last components are, if anywhere.
    let elsewhere: Vec<&String> = missing
        .iter()
        .filter_map(|p| p.rsplit('/').next())
        .flat_map(|base| names.iter().copied().filter(move |n| n.ends_with(base)))
        .collect();
    let near: Vec<String> = m.ops[best.saturating_sub(3)..(best + 3).min(m.ops.len())]
        .iter()
        .map(|o| format!("{o:?}"))
        .collect();
    // Every operation of the round on the names that differ.
    let history: Vec<String> = m
        .ops
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            let on = |p: &String| extra.contains(p) || missing.contains(p);
            match o {
                NsOp::Add(p, _) | NsOp::Remove(p) => on(p),
                NsOp::Move(a, b) => on(a) || on(b),
            }
        })
        .map(|(k, o)| format!("{k}:{o:?}"))
        .collect();
    Err(format!(
        "no prefix of the {} operations from the last acknowledged fsync (after {}) has these names; the closest is after {best}: extra {extra:?}, missing {missing:?} (found elsewhere: {elsewhere:?}); operations around it: {near:?}; the names' history: {history:?}",
        m.ops.len(),
        m.barrier
    ))
}

fn ctx<T>(what: &str, r: io::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// The writer: random operations on the tree under `root` until `killed`. The model is shared
/// so that what the kill interrupts is in it (recorded before each call is made).
/// Numbers the names the writers make, across rounds.
static NAME_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn writer(
    root: PathBuf,
    m: Arc<Mutex<Model>>,
    seed: u64,
    killed: Arc<AtomicBool>,
) -> Option<String> {
    let mut r = Rng::new(seed);
    let step = |r: &mut Rng| -> Result<(), String> {
        let cur = m.lock().unwrap().current();
        let dirs: Vec<String> = std::iter::once(String::new())
            .chain(
                cur.iter()
                    .filter(|(_, id)| m.lock().unwrap().objs[id].dir)
                    .map(|(p, _)| p.clone()),
            )
            .collect();
        // Regular files, and every name that is not a directory (symlinks too: renamed and
        // unlinked, never written or chmodded, which would follow them).
        let names_of = |links: bool| -> Vec<String> {
            let g = m.lock().unwrap();
            cur.iter()
                .filter(|(_, id)| !g.objs[id].dir && (links || g.objs[id].link.is_none()))
                .map(|(p, _)| p.clone())
                .collect()
        };
        let (files, non_dirs) = (names_of(false), names_of(true));
        let join = |d: &str, n: &str| {
            if d.is_empty() {
                n.to_string()
            } else {
                format!("{d}/{n}")
            }
        };
        // Never a name of an earlier round (ids start again each round: `n57-123` of round 3
        // and of round 17 collided once, and mkdir said EEXIST, rightly).
        let new_name =
            |r: &mut Rng| format!("n{}-{}", NAME_SEQ.fetch_add(1, SeqCst), r.below(1000));
        let choice = r.below(100);
        let shallow: Vec<&String> = dirs.iter().filter(|d| d.matches('/').count() < 3).collect();
        if choice < 12 {
            // mkdir, as tar does: a directory, then (later) files in it.
            let d = shallow[r.below(shallow.len())];
            let p = join(d, &format!("d{}", new_name(r)));
            let mut g = m.lock().unwrap();
            let id = g.add(Obj {
                dir: true,
                data: Vec::new(),
                mode: 0o755,
                synced: None,
                mode_loose: false,
                link: None,
            });
            g.push(NsOp::Add(p.clone(), id));
            drop(g);
            return ctx("mkdir", std::fs::create_dir(root.join(&p)));
        }
        if choice < 16 {
            // symlink, as tar makes one (to a name that does not exist)
            let d = &dirs[r.below(dirs.len())];
            let p = join(d, &format!("l{}", new_name(r)));
            let target = format!("../nowhere/{}", new_name(r));
            let mut g = m.lock().unwrap();
            let id = g.add(Obj {
                dir: false,
                data: Vec::new(),
                mode: 0,
                synced: None,
                mode_loose: false,
                link: Some(target.clone()),
            });
            g.push(NsOp::Add(p.clone(), id));
            drop(g);
            return ctx(
                "symlink",
                std::os::unix::fs::symlink(&target, root.join(&p)),
            );
        }
        if non_dirs.len() > 400 && (16..60).contains(&choice) {
            // A big tree: unlinks instead of creates, so that it stays a size each round can
            // read back quickly.
            let f = non_dirs[r.below(non_dirs.len())].clone();
            m.lock().unwrap().push(NsOp::Remove(f.clone()));
            return ctx("unlink", std::fs::remove_file(root.join(&f)));
        }
        if (44..50).contains(&choice) {
            // git's loose object: a temporary name written, linked to its final name in the
            // same directory, the temporary name unlinked (most of the time).
            let d = &dirs[r.below(dirs.len())];
            let data = seeded_bytes(r.next(), r.below(8 << 10));
            let (tmp, fin) = (
                join(d, &format!("t{}", new_name(r))),
                join(d, &format!("o{}", new_name(r))),
            );
            let unlink_tmp = r.below(4) != 0;
            let mut g = m.lock().unwrap();
            let id = g.add(Obj {
                dir: false,
                data: data.clone(),
                mode: 0o444,
                synced: None,
                mode_loose: true,
                link: None,
            });
            g.push(NsOp::Add(tmp.clone(), id));
            drop(g);
            let mut f = ctx(
                "create",
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o444)
                    .open(root.join(&tmp)),
            )?;
            ctx("write", f.write_all(&data))?;
            drop(f);
            m.lock().unwrap().push(NsOp::Add(fin.clone(), id));
            ctx("link", std::fs::hard_link(root.join(&tmp), root.join(&fin)))?;
            if unlink_tmp {
                m.lock().unwrap().push(NsOp::Remove(tmp.clone()));
                ctx("unlink", std::fs::remove_file(root.join(&tmp)))?;
            }
            return Ok(());
        }
        if choice < 50 || files.is_empty() {
            // create + write + chmod (+ fsync): an untarred file.
            let d = &dirs[r.below(dirs.len())];
            let len = r.below(96 << 10);
            let data = seeded_bytes(r.next(), len);
            let mode = [0o644, 0o600, 0o755, 0o640][r.below(4)];
            let sync = r.below(4) == 0;
            let p = join(d, &format!("f{}", new_name(r)));
            let mut g = m.lock().unwrap();
            let id = g.add(Obj {
                dir: false,
                data: data.clone(),
                mode,
                synced: None,
                mode_loose: true,
                link: None,
            });
            g.push(NsOp::Add(p.clone(), id));
            drop(g);
            let mut f = ctx(
                "create",
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(root.join(&p)),
            )?;
            ctx("write", f.write_all(&data))?;
            ctx(
                "chmod",
                f.set_permissions(std::fs::Permissions::from_mode(mode)),
            )?;
            if sync {
                ctx("fsync", f.sync_all())?;
                let mut g = m.lock().unwrap();
                let n = g.ops.len();
                g.barrier = n;
                let o = g.objs.get_mut(&id).unwrap();
                o.synced = Some(data);
                for o in g.objs.values_mut() {
                    o.mode_loose = false;
                }
            }
            return Ok(());
        }
        if (66..70).contains(&choice) && !files.is_empty() {
            // rsync's or an editor's save: a new file written aside, then renamed over a file
            // in its directory (one of an earlier round is the store's: `ns_replace`).
            let over = files[r.below(files.len())].clone();
            let d = over.rsplit_once('/').map_or("", |(d, _)| d);
            let tmp = join(d, &format!(".s{}", new_name(r)));
            let data = seeded_bytes(r.next(), r.below(32 << 10));
            let mut g = m.lock().unwrap();
            let id = g.add(Obj {
                dir: false,
                data: data.clone(),
                mode: 0o644,
                synced: None,
                mode_loose: true,
                link: None,
            });
            g.push(NsOp::Add(tmp.clone(), id));
            drop(g);
            let mut f = ctx(
                "create",
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(root.join(&tmp)),
            )?;
            ctx("write", f.write_all(&data))?;
            drop(f);
            m.lock()
                .unwrap()
                .push(NsOp::Move(tmp.clone(), over.clone()));
            return ctx(
                "rename over",
                std::fs::rename(root.join(&tmp), root.join(&over)),
            );
        }
        if choice < 70 {
            let f = non_dirs[r.below(non_dirs.len())].clone();
            if choice < 62 {
                // rename, within or across directories
                let d = &dirs[r.below(dirs.len())];
                let to = join(d, &format!("r{}", new_name(r)));
                m.lock().unwrap().push(NsOp::Move(f.clone(), to.clone()));
                return ctx("rename", std::fs::rename(root.join(&f), root.join(&to)));
            }
            m.lock().unwrap().push(NsOp::Remove(f.clone()));
            return ctx("unlink", std::fs::remove_file(root.join(&f)));
        }
        let f = files[r.below(files.len())].clone();
        let id = cur[&f];
        if choice < 80 {
            let mode = [0o644, 0o600, 0o755, 0o444][r.below(4)];
            {
                let mut g = m.lock().unwrap();
                let o = g.objs.get_mut(&id).unwrap();
                o.mode = mode;
                o.mode_loose = true;
            }
            return ctx(
                "chmod",
                std::fs::set_permissions(root.join(&f), std::fs::Permissions::from_mode(mode)),
            );
        }
        if choice < 90 {
            // append, or a rewrite (open O_TRUNC, as `std::fs::write` does), maybe fsync
            let add = seeded_bytes(r.next(), 1 + r.below(32 << 10));
            let sync = r.below(2) == 0;
            let rewrite = r.below(3) == 0;
            {
                let mut g = m.lock().unwrap();
                let o = g.objs.get_mut(&id).unwrap();
                if rewrite {
                    o.data.clear();
                }
                o.data.extend_from_slice(&add);
                o.synced = None;
            }
            // Mode 0444 files are written to as root all the same.
            let mut fh = ctx(
                "open",
                OpenOptions::new()
                    .append(!rewrite)
                    .write(rewrite)
                    .truncate(rewrite)
                    .open(root.join(&f)),
            )?;
            ctx(
                if rewrite { "rewrite" } else { "append" },
                fh.write_all(&add),
            )?;
            if sync {
                ctx("fsync", fh.sync_all())?;
                let mut g = m.lock().unwrap();
                let n = g.ops.len();
                g.barrier = n;
                let o = g.objs.get_mut(&id).unwrap();
                o.synced = Some(o.data.clone());
                for o in g.objs.values_mut() {
                    o.mode_loose = false;
                }
            }
            return Ok(());
        }
        // fsync of a directory: every name deferred before it is on the store.
        let d = dirs[r.below(dirs.len())].clone();
        ctx(
            "fsync(dir)",
            File::open(root.join(&d)).and_then(|f| f.sync_all()),
        )?;
        let mut g = m.lock().unwrap();
        let n = g.ops.len();
        g.barrier = n;
        for o in g.objs.values_mut() {
            o.mode_loose = false;
        }
        Ok(())
    };
    while !killed.load(SeqCst) {
        if let Err(e) = step(&mut r) {
            return (!killed.load(SeqCst)).then_some(e);
        }
    }
    None
}

#[test]
fn namespace_writeback_survives_kill9() {
    let seed = seed();
    let m = BinMount::unmounted_in(Path::new(TMP));
    let mnt = m.mnt.clone();
    let rounds = rounds();
    // 9 s a round at most (a CI round takes under 3 s here).
    let limit = Duration::from_secs(900.max(9 * rounds as u64));
    with_timeout(limit, vec![mnt.clone()], move || {
        let opts_env = std::env::var("TIERFS_NS_OPTS").unwrap_or_default();
        let mut opts = vec!["ram.max=64M", "writeback.mode=back"];
        opts.extend(opts_env.split(",").filter(|s| !s.is_empty()));
        let mut r = Rng::new(seed);
        let t0 = Instant::now();
        let sub = "tree";
        std::fs::create_dir(m.backing.join(sub)).unwrap();
        // Objects that survive from round to round, by path.
        let mut carried: Tree = Tree::new();
        let (mut ops, mut barriers_total, mut matched_at_end) = (0usize, 0usize, 0usize);
        // Saves over a file of the store acknowledged before the store had them (`ns_replace`).
        let mut replaced = 0;
        for round in 0..rounds {
            // The model starts from what BACKING holds now.
            let mut model = Model::default();
            // Names of one file (git's objects kept under both names): one object.
            let mut by_inode: BTreeMap<u64, u64> = BTreeMap::new();
            for (p, v) in &carried {
                let md = std::fs::symlink_metadata(m.backing.join(sub).join(p)).unwrap();
                if v.is_some() && md.is_file() && md.nlink() > 1 {
                    if let Some(id) = by_inode.get(&md.ino()) {
                        model.start.insert(p.clone(), *id);
                        model.cur.insert(p.clone(), *id);
                        continue;
                    }
                }
                let (dir, data, mode) = match v {
                    None => (true, Vec::new(), 0o755),
                    Some((d, md)) => (false, d.clone(), *md),
                };
                // A symlink (see `shown_link`).
                let link = (mode == 0)
                    .then(|| data.strip_prefix(b"->"))
                    .flatten()
                    .map(|t| String::from_utf8_lossy(t).into_owned());
                let id = model.add(Obj {
                    dir,
                    synced: (!dir && link.is_none()).then(|| data.clone()),
                    data,
                    mode,
                    mode_loose: false,
                    link,
                });
                model.start.insert(p.clone(), id);
                model.cur.insert(p.clone(), id);
                if md.is_file() && md.nlink() > 1 {
                    by_inode.insert(md.ino(), id);
                }
            }
            let shared = Arc::new(Mutex::new(model));
            m.mount(&opts);
            let killed = Arc::new(AtomicBool::new(false));
            let h = {
                let (root, shared, killed) = (m.mnt.join(sub), shared.clone(), killed.clone());
                let ws = r.next();
                std::thread::spawn(move || writer(root, shared, ws, killed))
            };
            std::thread::sleep(Duration::from_millis(r.range(20, 400)));
            killed.store(true, SeqCst);
            replaced += stat_of(&m.mnt, "writeback.namespace.replaced");
            m.kill_daemon();
            if let Some(e) = h.join().expect("writer panicked") {
                panic!("round {round}: the writer failed before the kill: {e}");
            }
            let model = shared.lock().unwrap().clone();
            if std::env::var_os("TIERFS_WB_INJECT_LOSS").is_some() {
                // A daemon that lost what an fsync acknowledged: a durable file vanishes.
                let names = model.names_at(model.barrier);
                if let Some((p, _)) = names.iter().find(|(p, id)| {
                    !model.objs[id].dir && model.objs[id].synced.is_some() && !p.contains('/')
                }) {
                    let _ = std::fs::remove_file(m.backing.join(sub).join(p));
                }
            }
            m.mount(&opts);
            let seen = read_tree(&m.mnt.join(sub));
            m.unmount_and_wait();
            let got = read_tree(&m.backing.join(sub));
            let log_errors = || {
                let log = std::fs::read_to_string(m.cache.join("tierfs.log")).unwrap_or_default();
                if let Some(keep) = std::env::var_os("TIERFS_NS_KEEP_LOG") {
                    let _ = std::fs::write(keep, &log);
                }
                let keys: Vec<String> = std::env::var("TIERFS_NS_GREP")
                    .map(|v| v.split(',').map(String::from).collect())
                    .unwrap_or_default();
                log.lines()
                    .filter(|l| {
                        l.contains("ERROR")
                            || l.contains("WARN")
                            || keys.iter().any(|k| !k.is_empty() && l.contains(k.as_str()))
                    })
                    .take(40)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let k = check(&model, &seen).unwrap_or_else(|e| {
                panic!(
                    "round {round}, through the mount after replay: {e}\nlog:\n{}",
                    log_errors()
                )
            });
            check(&model, &got).unwrap_or_else(|e| {
                panic!(
                    "round {round}, in BACKING after unmount: {e}\nlog:\n{}",
                    log_errors()
                )
            });
            if seen != got {
                let d: Vec<_> = seen
                    .iter()
                    .filter(|(k, v)| got.get(*k) != Some(*v))
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            v.as_ref().map(|x| (x.0.len(), x.1)),
                            got.get(k).map(|g| g.as_ref().map(|x| (x.0.len(), x.1))),
                        )
                    })
                    .chain(
                        got.keys()
                            .filter(|k| !seen.contains_key(*k))
                            .map(|k| (k.clone(), None, Some(None))),
                    )
                    .take(10)
                    .collect();
                panic!("round {round}: BACKING after the unmount differs from what the mount served: (path, served, backing) {d:?}\nlog:\n{}", log_errors());
            }
            let lost_files = lost_files(&m.cache);
            assert!(
                lost_files.is_empty(),
                "round {round}: journal/lost is not empty: {lost_files:?}"
            );
            ops += model.ops.len();
            barriers_total += model.barrier;
            matched_at_end += (k == model.ops.len()) as usize;
            carried = got;
        }
        println!(
            "ns_crash: {rounds} rounds, {ops} namespace operations, {barriers_total} of them before an acknowledged fsync, {matched_at_end} rounds with every operation on the store, {replaced} saves over a file of the store deferred; {} names at the end; {:.1} s",
            carried.len(),
            t0.elapsed().as_secs_f64()
        );
        assert!(barriers_total > 0, "no fsync was acknowledged in any round");
        assert!(
            replaced > 0,
            "no save over a file of the store was deferred"
        );
        assert!(
            carried.len() > 10,
            "the tree stayed too small to mean anything"
        );
    });
}
