//! The systemd unit (`contrib/systemd/tierfs@.service`, installed by scripts/setup): it passes
//! `systemd-analyze verify`, and its start and stop commands, run as systemd runs them (the
//! instance's `%f` and `%i`, the environment file's variables, `Type=forking`), mount the store
//! and, at stop, return only once what was written through the mount in write-back is on the
//! store and the daemon has exited.

mod common;
use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn unit_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/tierfs@.service");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The unit with the installed binary's path replaced by the binary under test.
fn unit_for_test() -> String {
    let text = unit_text();
    assert!(
        text.contains("/usr/local/bin/tierfs"),
        "the unit runs the binary scripts/setup installs"
    );
    text.replace("/usr/local/bin/tierfs", tierfs_bin())
}

/// `systemd-escape --path PATH`: the instance name systemd gives a path.
fn escape_path(p: &Path) -> String {
    let out = Command::new("systemd-escape")
        .arg("--path")
        .arg(p)
        .output()
        .expect("systemd-escape (package systemd; scripts/deps installs it)");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The values of `key=` lines in the unit's [Service] section, in order.
fn service_lines(unit: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}=");
    unit.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// A command line as systemd expands it: `%f` (the instance's path) and `%i` (its escaped
/// name) anywhere; a word `$NAME` split into the variable's words, `${NAME}` as one word.
fn expand(line: &str, f: &Path, i: &str, env: &HashMap<String, String>) -> Vec<String> {
    let line = line.replace("%f", &f.to_string_lossy()).replace("%i", i);
    let mut words = Vec::new();
    for w in line.split_whitespace() {
        if let Some(name) = w.strip_prefix("${").and_then(|n| n.strip_suffix('}')) {
            words.push(env.get(name).cloned().unwrap_or_default());
        } else if let Some(name) = w.strip_prefix('$') {
            let v = env.get(name).cloned().unwrap_or_default();
            words.extend(v.split_whitespace().map(str::to_string));
        } else {
            words.push(w.to_string());
        }
    }
    words
}

/// Runs one Exec line (bounded by `timeout`), panicking with its output if it fails.
fn run(words: &[String], limit_s: u32) {
    let out = Command::new("timeout")
        .arg(limit_s.to_string())
        .args(words)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{words:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let dir = tempfile::tempdir().unwrap();
    let inst = dir.path().join("tierfs@mnt-fast.service");
    std::fs::write(&inst, unit_for_test()).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&inst)
        .output()
        .expect("systemd-analyze (package systemd; scripts/deps installs it)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {err}");
    // verify exits 0 on some warnings; a warning about this unit is a defect too.
    let about_us: Vec<&str> = err.lines().filter(|l| l.contains("tierfs@")).collect();
    assert!(about_us.is_empty(), "systemd-analyze verify: {about_us:?}");
    let unit = unit_text();
    for key in [
        "Type=forking",
        "ExecStop=",
        "EnvironmentFile=/etc/tierfs/%i.env",
    ] {
        assert!(unit.contains(key), "the unit lacks {key}");
    }
}

#[test]
fn start_mounts_and_stop_returns_once_write_back_is_on_the_store() {
    let m = BinMount::unmounted_in(&std::env::temp_dir());
    std::fs::write(m.backing.join("old"), b"on the store before").unwrap();
    // The instance's path: the mount point does not exist yet (ExecStartPre makes it).
    let mnt: PathBuf = m.dir.path().join("srv/fast");
    let inst = escape_path(&mnt);
    let unit = unit_for_test();
    let env: HashMap<String, String> = [
        ("TIERFS_BACKING", m.backing.to_string_lossy().into_owned()),
        (
            "TIERFS_ARGS",
            format!(
                "--cache-dir {} -o writeback.mode=back,writeback.namespace_delay=1h,writeback.namespace_quiet=1h",
                m.cache.display()
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let _cleanup = LazyUnmount(mnt.clone());
    for line in service_lines(&unit, "ExecStartPre") {
        run(&expand(&line, &mnt, &inst, &env), 30);
    }
    let start = service_lines(&unit, "ExecStart");
    assert_eq!(start.len(), 1, "one ExecStart");
    // Type=forking: the start command returns once the service is up.
    run(&expand(&start[0], &mnt, &inst, &env), 60);
    assert!(is_mounted(&mnt), "mounted when ExecStart returned");
    let pid = daemon_pid(&mnt).expect("a daemon serves the mount");

    let big = seeded_bytes(7, 48 << 20);
    with_timeout(Duration::from_secs(120), vec![mnt.clone()], {
        let (mnt, big) = (mnt.clone(), big.clone());
        move || {
            assert_eq!(
                std::fs::read(mnt.join("old")).unwrap(),
                b"on the store before"
            );
            std::fs::create_dir(mnt.join("new")).unwrap();
            std::fs::write(mnt.join("new/small"), b"written just before stop").unwrap();
            std::fs::write(mnt.join("new/big"), &big).unwrap();
        }
    });
    // Deferred (namespace_delay=1h): nothing of it on the store yet, so stop has work to do.
    assert!(
        !m.backing.join("new").exists(),
        "nothing flushed before stop"
    );

    let stop = service_lines(&unit, "ExecStop");
    assert_eq!(stop.len(), 1, "one ExecStop");
    run(&expand(&stop[0], &mnt, &inst, &env), 600);
    // What systemd checks after ExecStop: the main process is gone (else it would SIGTERM it).
    assert!(
        wait_exit(pid, Duration::from_millis(100)),
        "the daemon still runs after ExecStop returned"
    );
    assert!(!is_mounted(&mnt), "unmounted at stop");
    assert_eq!(
        std::fs::read(m.backing.join("new/small")).unwrap(),
        b"written just before stop"
    );
    assert!(
        std::fs::read(m.backing.join("new/big")).unwrap() == big,
        "every byte of new/big on the store when ExecStop returned"
    );
}

/// `fusermount3 -uz` of a mount point on drop, even on panic.
struct LazyUnmount(PathBuf);

impl Drop for LazyUnmount {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.0).status();
        }
    }
}
