//! A database that lost its contents is refused at start, with the steps to recover,
//! instead of starting as an empty database (every setting and session gone, no
//! word said) or failing later with a "malformed" error that reads as transient.
//!
//! Checked before SQLite opens the file, from the files alone: a 0-byte main file
//! beside data of earlier runs (a WAL with frames, the decision log), a main file
//! cut short (shorter than its header, not whole pages, or fewer pages than its
//! header counts), a WAL whose header is cut or whose page size is not the main
//! file's. Where SQLite could still make it whole (a checkpoint cut short leaves
//! the main file shorter than its header says, with the pages in the WAL), the
//! verdict is left to `PRAGMA quick_check` once the file is open.

use std::io::Read as _;
use std::path::{Path, PathBuf};

/// What the files say before SQLite opens them.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing wrong, or a file SQLite will create or initialize.
    Sound,
    /// Possibly cut short, possibly mid-checkpoint: ask SQLite once it is open.
    CheckWhenOpen(String),
}

const HEADER: &[u8; 16] = b"SQLite format 3\0";
const WAL_MAGIC: [u32; 2] = [0x377f_0682, 0x377f_0683];

/// Looks at `path` (the main file) and its neighbours; `Err` says what was lost.
/// Folders of the data dir that only a run which wrote the database can have filled.
const STATE_BESIDE: [&str; 2] = ["scratchpad", "vectors"];

pub(super) fn inspect(path: &Path) -> Result<Verdict, String> {
    let wal = with_suffix(path, "-wal");
    let decisions = super::decisions_path(path);
    let main_len = match std::fs::metadata(path) {
        Ok(metadata) => metadata.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Verdict::Sound),
        Err(e) => return Err(format!("cannot inspect it: {e}")),
    };
    let wal_len = std::fs::metadata(&wal).map_or(0, |m| m.len());
    let decisions_len = std::fs::metadata(&decisions).map_or(0, |m| m.len());
    if main_len == 0 {
        // A crash between creating the file and its first write leaves 0 bytes and
        // nothing else; data beside it means the main file was emptied.
        if wal_len > 0 {
            return Err(format!(
                "it is empty (0 bytes) while its WAL ({}) holds {wal_len} bytes of an earlier run",
                wal.display()
            ));
        }
        if decisions_len > 0 {
            return Err(format!(
                "it is empty (0 bytes) while the decision log beside it ({}) holds {decisions_len} bytes of earlier runs",
                decisions.display()
            ));
        }
        // The scratchpad's databases and the vector cache are written only after
        // the database has been: a first run cannot have left them.
        if let Some(dir) = path.parent() {
            for state in STATE_BESIDE {
                let state = dir.join(state);
                let used =
                    std::fs::read_dir(&state).is_ok_and(|mut entries| entries.next().is_some());
                if used {
                    return Err(format!(
                        "it is empty (0 bytes) while {} beside it holds data of earlier runs",
                        state.display()
                    ));
                }
            }
        }
        return Ok(Verdict::Sound);
    }
    let mut header = [0u8; 100];
    let n_read = read_prefix(path, &mut header).map_err(|e| format!("cannot read it: {e}"))?;
    if n_read < header.len() {
        return Err(format!(
            "it is cut short: {main_len} bytes, less than a database header"
        ));
    }
    if &header[..16] != HEADER {
        return Err("it is not a SQLite database (its header is not SQLite's)".into());
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u64::from(n),
    };
    if page_size < 512 || !page_size.is_power_of_two() {
        return Err(format!("its header is damaged (page size {page_size})"));
    }
    let has_wal = wal_len > 0;
    if has_wal {
        check_wal(&wal, wal_len, page_size)?;
    }
    if main_len % page_size != 0 {
        return Err(format!(
            "it is cut short: {main_len} bytes is not a whole number of {page_size}-byte pages"
        ));
    }
    // The header's page count is valid when its change counter matches the
    // version-valid-for number (SQLite's file format, §1.3.7).
    let counter = &header[24..28];
    let valid_for = &header[92..96];
    let header_pages = u32::from_be_bytes([header[28], header[29], header[30], header[31]]);
    let expected = u64::from(header_pages) * page_size;
    if counter == valid_for && header_pages > 0 && expected > main_len {
        let what = format!(
            "it is cut short: {main_len} bytes, while its header counts {header_pages} pages ({expected} bytes)"
        );
        return if has_wal {
            Ok(Verdict::CheckWhenOpen(what))
        } else {
            Err(what)
        };
    }
    Ok(Verdict::Sound)
}

fn check_wal(wal: &Path, wal_len: u64, page_size: u64) -> Result<(), String> {
    let mut header = [0u8; 32];
    let n_read = read_prefix(wal, &mut header)
        .map_err(|e| format!("its WAL ({}) cannot be read: {e}", wal.display()))?;
    if n_read < header.len() {
        return Err(format!(
            "its WAL ({}) is cut short ({wal_len} bytes, less than a WAL header): the transactions in it are lost",
            wal.display()
        ));
    }
    let magic = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let wal_page_size = u64::from(u32::from_be_bytes([
        header[8], header[9], header[10], header[11],
    ]));
    if !WAL_MAGIC.contains(&magic) {
        return Err(format!(
            "its WAL ({}) is not a SQLite WAL (its header is damaged)",
            wal.display()
        ));
    }
    if wal_page_size != page_size {
        return Err(format!(
            "its WAL ({}) does not fit it: the WAL's pages are {wal_page_size} bytes, the database's {page_size}",
            wal.display()
        ));
    }
    Ok(())
}

fn read_prefix(path: &Path, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut file = std::fs::File::open(path)?;
    let mut n_read = 0;
    while n_read < buffer.len() {
        match file.read(&mut buffer[n_read..])? {
            0 => break,
            n => n_read += n,
        }
    }
    Ok(n_read)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The refusal: what was found, and how to recover.
pub(super) fn refusal(path: &Path, what: &str) -> String {
    let name = path.display();
    format!(
        "{name} lost its contents: {what}. loadout will not start on it (it would start empty, or fail later). \
To recover: stop every loadout using this data dir; then restore {name} from a backup together with its -wal file if the backup has one; \
or keep what SQLite can still read with `sqlite3 {name} .recover | sqlite3 recovered.db` and put recovered.db in its place; \
or, to start empty on purpose, move {name} and its -wal and -shm files aside."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::write(path, bytes).expect("write");
    }

    #[test]
    fn fresh_and_missing_files_are_sound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("loadout.db");
        assert_eq!(inspect(&db), Ok(Verdict::Sound));
        write(&db, b"");
        assert_eq!(inspect(&db), Ok(Verdict::Sound));
    }

    #[test]
    fn an_emptied_file_beside_earlier_data_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("loadout.db");
        write(&db, b"");
        write(
            &super::super::decisions_path(&db),
            b"SQLite format 3\0 and more",
        );
        assert!(inspect(&db).is_err_and(|e| e.contains("0 bytes")));
    }

    /// Issue 36: a 0-byte `loadout.db` with no WAL or decision log, but the
    /// scratchpad's databases beside it, started empty without a word.
    #[test]
    fn an_emptied_file_beside_other_state_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("loadout.db");
        write(&db, b"");
        std::fs::create_dir(dir.path().join("scratchpad")).expect("mkdir");
        // An empty folder is no earlier data.
        assert_eq!(inspect(&db), Ok(Verdict::Sound));
        write(
            &dir.path().join("scratchpad/alice.db"),
            b"SQLite format 3\0",
        );
        let refused = inspect(&db).expect_err("refused");
        assert!(
            refused.contains("0 bytes") && refused.contains("scratchpad"),
            "{refused}"
        );
        let message = refusal(&db, &refused);
        assert!(
            message.contains("To recover") && message.contains(".recover"),
            "{message}"
        );
    }

    #[test]
    fn cut_files_and_foreign_headers_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("loadout.db");
        write(&db, b"SQLite format 3\0");
        assert!(inspect(&db).is_err_and(|e| e.contains("less than a database header")));
        write(&db, &[b'x'; 4096]);
        assert!(inspect(&db).is_err_and(|e| e.contains("not a SQLite database")));
    }
}
