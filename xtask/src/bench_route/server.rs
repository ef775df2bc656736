//! The `loadout` processes the benchmark runs: settings written with its CLI, and
//! `loadout serve` on a free loopback port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// `loadout` run on `data_dir`, with PostgreSQL at `url` or SQLite in the data dir.
pub(super) fn loadout(bin: &Path, data_dir: &Path, url: Option<&str>) -> Command {
    let mut command = Command::new(bin);
    command.env("LOADOUT_DATA_DIR", data_dir);
    command.env("LOADOUT_LOG", "warn");
    match url {
        Some(url) => command.env("LOADOUT_DATABASE_URL", url),
        None => command.env_remove("LOADOUT_DATABASE_URL"),
    };
    command
}

/// A `loadout serve` child on a free loopback port, killed on drop.
pub(super) struct Server {
    pub(super) child: Child,
    pub(super) addr: String,
}

/// The type of the file system that holds `path` (the mount point of `mounts`, in
/// `/proc/mounts`' format, that is the longest prefix of it); `None` if no line says.
pub(super) fn file_system_of(path: &Path, mounts: &str) -> Option<String> {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            // The kernel writes a space in a mount point as `\040`.
            let mount_point = PathBuf::from(fields.next()?.replace("\\040", " "));
            let fs = fields.next()?;
            path.starts_with(&mount_point)
                .then(|| (mount_point.components().count(), fs.to_owned()))
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, fs)| fs)
}

impl Server {
    pub(super) fn start(bin: &Path, data_dir: &Path, url: Option<&str>) -> anyhow::Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = loadout(bin, data_dir, url)
            .args(["serve", "--addr", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting loadout serve")?;
        let server = Server { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&server.addr).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "loadout serve did not listen on {} within 30 s",
                    server.addr
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_system_is_the_deepest_mount_that_holds_the_path() {
        let mounts = "/dev/vda / ext4 rw 0 0
tmpfs /dev/shm tmpfs rw,nosuid 0 0
proc /proc proc rw 0 0
tmpfs /mnt/with\\040space tmpfs rw 0 0
";
        let fs = |p: &str| file_system_of(Path::new(p), mounts);
        assert_eq!(
            fs("/dev/shm/loadout-bench-route-1").as_deref(),
            Some("tmpfs")
        );
        assert_eq!(fs("/tmp/loadout-bench-route-1").as_deref(), Some("ext4"));
        assert_eq!(fs("/mnt/with space/x").as_deref(), Some("tmpfs"));
        // A path component is not a prefix of a longer one.
        assert_eq!(fs("/dev/shmem/x").as_deref(), Some("ext4"));
        assert_eq!(file_system_of(Path::new("/x"), "garbage\n"), None);
    }
}
