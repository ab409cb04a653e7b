//! A real S3 server for tests: `scripts/s3-server DIR PORT` (versitygw over a temporary
//! directory) on a free loopback port, stopped when dropped.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS: &str = "tierfs";
pub const SECRET: &str = "tierfs-secret";

pub struct S3Server {
    child: Child,
    /// The server's directory: a subdirectory per bucket.
    #[allow(dead_code)]
    pub dir: tempfile::TempDir,
    pub endpoint: String,
    port: u16,
    /// Where the server logs every request it answers (see [`S3Server::requests`]).
    log: tempfile::TempDir,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/s3-server")
}

/// Builds the server once for all tests of the run (the script is idempotent; a lock keeps
/// parallel tests from building it twice at once).
fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let out = Command::new("flock")
            .arg(std::env::temp_dir().join("tierfs-s3-server-install.lock"))
            .arg(script())
            .arg("--install")
            .output()
            .expect("run scripts/s3-server --install");
        assert!(
            out.status.success(),
            "scripts/s3-server --install failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// Starts the server on `port` and waits until it listens.
fn spawn(dir: &Path, port: u16, log: &Path) -> Child {
    let child = Command::new(script())
        .arg(dir)
        .arg(port.to_string())
        .env("S3_SERVER_ACCESS_LOG", log.join("access.log"))
        .env("AWS_ACCESS_KEY_ID", ACCESS)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start scripts/s3-server");
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "S3 server did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl S3Server {
    /// A server with the buckets `buckets` (empty directories).
    pub fn start(buckets: &[&str]) -> S3Server {
        install();
        let dir = tempfile::tempdir().unwrap();
        for b in buckets {
            std::fs::create_dir(dir.path().join(b)).unwrap();
        }
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let log = tempfile::tempdir().unwrap();
        let child = spawn(dir.path(), port, log.path());
        S3Server {
            child,
            dir,
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            log,
        }
    }

    /// How many requests of kind `op` (as the access log names them: `s3_GetObject`,
    /// `s3_HeadObject`, ...) the server answered for key `key` (bucket excluded) so far.
    #[allow(dead_code)]
    pub fn requests(&self, op: &str, key: &str) -> usize {
        let log = std::fs::read_to_string(self.log.path().join("access.log")).unwrap_or_default();
        log.lines()
            .filter(|l| {
                let mut w = l.split(' ').skip_while(|w| *w != op);
                w.next().is_some() && w.next() == Some(key)
            })
            .count()
    }

    /// The server goes away: nothing listens on its port.
    #[allow(dead_code)]
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Back on the same port, serving the same directory.
    #[allow(dead_code)]
    pub fn restart(&mut self) {
        self.child = spawn(self.dir.path(), self.port, self.log.path());
    }

    /// SIGSTOP (`hang`) or SIGCONT: a server that accepts connections and never answers.
    #[allow(dead_code)]
    pub fn hang(&self, hang: bool) {
        let sig = if hang { libc::SIGSTOP } else { libc::SIGCONT };
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.hang(false);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
