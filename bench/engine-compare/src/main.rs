//! engine-compare: measure foyer's HybridCache (block engine on a directory) as a
//! candidate SSD-tier engine for tierfs.
//!
//! Subcommands (all take `--dir DIR`, which is wiped first unless noted):
//!   throughput   insert 2 GiB of 64 KiB values, random disk-hit gets (64 KiB @1,4 tasks),
//!                then 4 KiB values (random gets @1,16,32), plain-thread block_on cost
//!   unpaced      insert 2 GiB of 64 KiB values as fast as insert() returns (no back-pressure)
//!                and count what reached the disk
//!   recovery     insert 1,000,000 entries of 512 B..4 KiB, close, reopen (timed), verify
//!   crash        spawn `crash-child`, SIGKILL it mid-insert, reopen (timed), verify
//!   corrupt      insert, close, flip bytes in foyer's data files, reopen, read everything back
//!   crash-child  (internal) inserts 1,000,000 entries, prints progress, never closes
//!
//! Here: the command line and the dispatch; `cache` opens foyer and inserts, `reads` times random
//! gets, `throughput` and `durability` are the commands.

mod cache;
mod durability;
mod reads;
mod throughput;

use anyhow::{bail, Context, Result};
use std::path::PathBuf;

use cache::{Opts, GIB, MIB};
use durability::{cmd_corrupt, cmd_crash, cmd_crash_child, cmd_recovery};
use throughput::{cmd_throughput, cmd_unpaced};

fn parse() -> (String, Opts) {
    let args: Vec<String> = std::env::args().collect();
    let cmd = args.get(1).cloned().unwrap_or_default();
    let mut o = Opts {
        dir: PathBuf::from("/var/tmp/foyer-bench/x"),
        disk: 8 * GIB,
        mem: 64 * MIB,
        direct: true,
        queue_threshold: 256 * MIB,
        buffer_pool: 64 * MIB,
        seconds: 10.0,
    };
    let mut i = 2;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--dir" => o.dir = PathBuf::from(v),
            "--disk-gib" => o.disk = v.parse::<usize>().unwrap() * GIB,
            "--mem-mib" => o.mem = v.parse::<usize>().unwrap() * MIB,
            "--buffered" => {
                o.direct = false;
                i += 1;
                continue;
            }
            "--queue-mib" => o.queue_threshold = v.parse::<usize>().unwrap() * MIB,
            "--buffer-mib" => o.buffer_pool = v.parse::<usize>().unwrap() * MIB,
            "--seconds" => o.seconds = v.parse().unwrap(),
            x => panic!("unknown arg {x}"),
        }
        i += 2;
    }
    (cmd, o)
}

fn main() -> Result<()> {
    let (cmd, o) = parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        match cmd.as_str() {
            "throughput" => cmd_throughput(o).await,
            "unpaced" => cmd_unpaced(o).await,
            "recovery" => cmd_recovery(o).await,
            "crash" => cmd_crash(o).await,
            "crash-child" => cmd_crash_child(o).await,
            "corrupt" => cmd_corrupt(o).await,
            _ => bail!("usage: engine-compare throughput|unpaced|recovery|crash|corrupt --dir DIR [--seconds S] [--buffered]"),
        }
    })
    .context(cmd_name())
}

fn cmd_name() -> String {
    std::env::args().nth(1).unwrap_or_default()
}
