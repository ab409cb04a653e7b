use super::*;
use std::time::Duration;

#[test]
fn sizes_and_durations() {
    assert_eq!(parse_size("4G").unwrap(), 4 << 30);
    assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
    assert_eq!(parse_size("64k").unwrap(), 64 << 10);
    assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
    assert!(parse_size("lots").is_err());
    assert!(parse_size("-1G").is_err());
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn out_of_range_values_are_refused() {
    assert!(parse_duration("18446744073709551615").is_err());
    assert!(parse_duration("366d").is_err());
    assert_eq!(
        parse_duration("7d").unwrap(),
        Duration::from_secs(7 * 86400)
    );
    assert!(parse_size("99999999999999999999").is_err());
    assert!(parse_size("1P").is_err());
    let refused = |k: &str, v: &str| {
        let mut c = Config::default();
        c.set(k, v).and_then(|_| c.validate()).is_err()
    };
    assert!(refused("ram.max", "0"));
    assert!(refused("ram.max", "1K"));
    assert!(refused("ssd.write_burst", "0"));
    assert!(!refused("ram.max", "512K"));
    let mut c = Config::default();
    c.set("ram.block_size", "8K").unwrap();
    c.set("ram.max", "64K").unwrap();
    c.validate().unwrap();
}

#[test]
fn every_key_reads_back_as_it_is_set() {
    let mut c = Config::default();
    for k in Config::KEYS {
        let v = c.get(k).unwrap_or_else(|| panic!("no value for {k}"));
        c.set(k, &v).unwrap_or_else(|e| panic!("{k}={v}: {e:#}"));
        assert_eq!(c.get(k).as_deref(), Some(v.as_str()), "{k}");
    }
    assert_eq!(c.get("ram.maxx"), None);
    assert_eq!(format_size(3 << 19), "1536K");
    assert_eq!(format_size(100 << 20), "100M");
    assert_eq!(format_size(1000), "1000");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
    assert_eq!(
        parse_duration(&format_duration(Duration::from_micros(1500))).unwrap(),
        Duration::from_micros(1500)
    );
}

/// Config::KEYS, what `set` takes and docs/tunables.md name the same keys.
#[test]
fn keys_are_the_documented_ones() {
    let docs = include_str!("../../../docs/tunables.md");
    let documented: Vec<&str> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect();
    let mut a = documented.clone();
    let mut b = Config::KEYS.to_vec();
    a.sort();
    b.sort();
    assert_eq!(a, b, "docs/tunables.md vs Config::KEYS");
    let mut c = Config::default();
    for k in documented {
        let v = c.get(k).unwrap();
        assert!(c.set(k, &v).is_ok(), "set does not take {k}");
    }
}

#[test]
fn metrics_addresses() {
    let local = |p| Some(SocketAddr::from(([127, 0, 0, 1], p)));
    assert_eq!(parse_metrics_addr("9100").unwrap(), local(9100));
    assert_eq!(parse_metrics_addr(":9100").unwrap(), local(9100));
    assert_eq!(parse_metrics_addr("localhost:9100").unwrap(), local(9100));
    assert_eq!(
        parse_metrics_addr("0.0.0.0:9100").unwrap(),
        Some(SocketAddr::from(([0, 0, 0, 0], 9100)))
    );
    assert!(parse_metrics_addr("[::1]:9100").unwrap().is_some());
    assert_eq!(parse_metrics_addr("off").unwrap(), None);
    assert!(parse_metrics_addr("example.com:80").is_err());
    assert!(parse_metrics_addr("99999").is_err());
}

#[test]
fn options_and_files() {
    let mut c = Config::default();
    c.apply_mount_option("ram.max=2G").unwrap();
    c.apply_mount_option("meta.ttl=5s").unwrap();
    c.apply_mount_option("defaults").unwrap();
    c.apply_mount_option("x-systemd.automount").unwrap();
    c.apply_mount_option("nosuid").unwrap();
    assert_eq!(c.fs.ram_max, 2 << 30);
    assert_eq!(c.fuse.attr_ttl, Duration::from_secs(5));
    // ram.min follows a small ram.max down unless given; given above it, it is an error.
    c.apply_mount_option("ram.max=32M").unwrap();
    assert_eq!(c.pressure_config().min, 32 << 20);
    c.validate().unwrap();
    c.apply_mount_option("ram.min=48M").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("ram.min") && e.contains("ram.max"), "{e}");
    c.apply_mount_option("ram.max=2G").unwrap();
    c.apply_mount_option("ram.free_floor=1G").unwrap();
    c.apply_mount_option("ram.grow_delay=2s").unwrap();
    c.apply_mount_option("ram.psi_pct=0").unwrap();
    c.apply_mount_option("ram.pressure=off").unwrap();
    let p = c.pressure_config();
    assert_eq!((p.min, p.max, p.free_floor), (48 << 20, 2 << 30, 1 << 30));
    assert_eq!((p.grow_delay, p.psi_pct), (Duration::from_secs(2), 0));
    assert!(!c.pressure_enable);
    assert!(c.apply_mount_option("ram.psi_pct=101").is_err());
    assert!(c.apply_mount_option("ram.maxx=1G").is_err());
    assert!(c.apply_mount_option("bogus").is_err());
    assert!(c.apply_mount_option("ram.block_size=3000").is_err());

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.toml");
    std::fs::write(
        &f,
        "[ram]\nmax = \"1G\"\nblock_size = 131072\n[meta]\nttl = \"3s\"\n",
    )
    .unwrap();
    c.load_file(&f).unwrap();
    assert_eq!((c.fs.ram_max, c.fs.block_size), (1 << 30, 131072));
    std::fs::write(&f, "[ram\nmax=").unwrap();
    assert!(c.load_file(&f).is_err());
    std::fs::write(&f, "[ram]\nmaks = 1\n").unwrap();
    let e = format!("{:#}", c.load_file(&f).unwrap_err());
    assert!(e.contains("ram.maks"), "{e}");
}
