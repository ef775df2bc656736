//! The `filesystem` domain: browse, search, read and write files, confined to the
//! directories listed in the `filesystem_roots` setting.
//!
//! Every path goes through [`roots::Roots::resolve`] before any file is touched: `..`,
//! absolute paths outside the roots and symbolic links leading out are refused with
//! a message saying which. Depends on `loadout` only, never on another domain crate.

mod pattern;
mod roots;

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::SystemTime;

use loadout::{ToolContext, ToolError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use pattern::Pattern;
pub use roots::{ROOTS_KEY, Resolved, Roots};

loadout::domain! {
    name: "filesystem",
    description: "Local files in the folders the user allowed (setting `filesystem_roots`): browse directories, find files by name pattern, read text files, write files, and get file details.",
    settings_keys: ["filesystem_roots"],
    keywords: [
        "file", "files", "folder", "directory", "read file", "write file", "save",
        "document", "path", "disk", "ls", "find", "파일", "폴더", "디렉토리",
    ],
}

// The roots decide what every tool here can reach: only the operator widens them.
loadout::setting! {
    key: ROOTS_KEY,
    kind: loadout::SettingKind::Custom,
    trust: loadout::Trust::Operator,
    description: "the folders the filesystem tools may reach: a JSON array of absolute directory paths",
    validate: |value: &str| Roots::parse(value).map(|_| ()).map_err(|e| e.to_string()),
}

/// Referenced by the `loadout-domains` hub so the linker keeps this crate.
pub fn link() {}

/// Default and largest number of bytes `read_file` returns.
pub const DEFAULT_READ_BYTES: u64 = 1024 * 1024;
pub const MAX_READ_BYTES: u64 = 4 * 1024 * 1024;
/// Largest content `write_file` accepts, in bytes.
pub const MAX_WRITE_BYTES: usize = 10 * 1024 * 1024;
/// Limits of `browse_directory` and `find_files`.
pub const DEFAULT_LIST_ENTRIES: usize = 200;
pub const MAX_LIST_ENTRIES: usize = 1000;
pub const DEFAULT_FIND_RESULTS: usize = 100;
pub const MAX_FIND_RESULTS: usize = 1000;
pub const DEFAULT_FIND_DEPTH: usize = 8;
pub const MAX_FIND_DEPTH: usize = 32;
/// Most directory entries one `find_files` call looks at.
pub const MAX_FIND_VISITS: usize = 100_000;

// ---------------------------------------------------------------------------
// Results

/// Kind of a directory entry; links are reported, not followed.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

impl EntryKind {
    fn of(file_type: fs::FileType) -> EntryKind {
        if file_type.is_symlink() {
            EntryKind::Symlink
        } else if file_type.is_dir() {
            EntryKind::Directory
        } else if file_type.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DirEntryInfo {
    pub name: String,
    pub kind: EntryKind,
    /// Bytes, for files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct DirectoryListing {
    pub path: String,
    pub entries: Vec<DirEntryInfo>,
    /// Entries in the directory (after the hidden filter).
    pub n_entries: usize,
    pub truncated: bool,
    /// The allowed roots, so the caller knows where else it may look.
    pub roots: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct FileInfo {
    pub path: String,
    pub kind: EntryKind,
    pub size: u64,
    pub modified: Option<String>,
    pub created: Option<String>,
    pub readonly: bool,
    /// Where the given path pointed, when it was a symbolic link (inside the roots).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// Entries, for a directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_entries: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct FoundFile {
    pub path: String,
    pub kind: EntryKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct FindResult {
    pub directory: String,
    pub pattern: String,
    pub matches: Vec<FoundFile>,
    /// More matched than `max_results`.
    pub truncated: bool,
    /// The search stopped early after looking at too many entries; narrow it.
    pub scan_limited: bool,
}

#[derive(Debug, Serialize)]
pub struct FileContent {
    pub path: String,
    /// Size of the whole file in bytes.
    pub size: u64,
    /// The text read; absent for binary files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    pub binary: bool,
    pub offset: u64,
    pub n_bytes_read: u64,
    /// The file continues past what was returned; read on from `next_offset`.
    pub truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct FileWritten {
    pub path: String,
    pub n_bytes: usize,
    /// False when an existing file was overwritten.
    pub created: bool,
}

// ---------------------------------------------------------------------------
// Arguments

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowseArgs {
    /// Directory to list: relative to the first root, or absolute inside a root. The
    /// first root when omitted.
    #[serde(default)]
    pub path: Option<String>,
    /// Include names starting with `.`.
    #[serde(default)]
    pub include_hidden: bool,
    /// Most entries to return: default 200, at most 1000.
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    /// Relative to the first root, or absolute inside a root.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindArgs {
    /// Name pattern: `*` any characters, `?` one character, e.g. `*.pdf` or
    /// `report-202?-*.xlsx`. With `/` it matches the path below `path`, and a `**`
    /// segment spans directories, e.g. `projects/**/notes.md`.
    pub pattern: String,
    /// Directory to search in; the first root when omitted.
    #[serde(default)]
    pub path: Option<String>,
    /// How many directory levels to descend: default 8, at most 32.
    #[serde(default)]
    pub max_depth: Option<u32>,
    /// Most matches to return: default 100, at most 1000.
    #[serde(default)]
    pub max_results: Option<u32>,
    /// Match upper and lower case exactly (default: ignore case).
    #[serde(default)]
    pub case_sensitive: bool,
    /// Look inside and match names starting with `.`.
    #[serde(default)]
    pub include_hidden: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// File to read: relative to the first root, or absolute inside a root.
    pub path: String,
    /// Most bytes to return: default 1048576 (1 MiB), at most 4 MiB.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Byte offset to start at, to continue a truncated read.
    #[serde(default)]
    pub offset: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// File to write: relative to the first root, or absolute inside a root.
    pub path: String,
    /// The complete new text of the file (UTF-8).
    pub content: String,
    /// Replace the file if it exists (default: refuse).
    #[serde(default)]
    pub overwrite: bool,
    /// Create missing parent directories (default: refuse).
    #[serde(default)]
    pub create_dirs: bool,
}

// ---------------------------------------------------------------------------
// Tools

/// Lists a directory inside the allowed folders: names, kinds, sizes and modification times.
///
/// Without `path` it lists the first allowed root; the response also names all roots.
#[loadout::tool(
    domain = "filesystem",
    keywords = ["ls", "list files", "directory", "folder contents", "폴더 목록"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn browse_directory(
    args: BrowseArgs,
    ctx: &ToolContext,
) -> Result<DirectoryListing, ToolError> {
    let roots = load_roots(ctx).await?;
    let limit = bounded(args.limit, DEFAULT_LIST_ENTRIES, MAX_LIST_ENTRIES)?;
    blocking(move || {
        let resolved = roots.resolve(args.path.as_deref().unwrap_or(""))?;
        require_exists(&resolved)?;
        if !resolved.path.is_dir() {
            return Err(ToolError::execution(format!(
                "`{}` is a file, not a directory; use read_file or file_info",
                resolved.lexical.display()
            )));
        }
        let mut entries = Vec::new();
        for entry in fs::read_dir(&resolved.path).map_err(|e| io_error(&resolved.path, e))? {
            let entry = entry.map_err(|e| io_error(&resolved.path, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !args.include_hidden && name.starts_with('.') {
                continue;
            }
            let metadata = entry.metadata().ok();
            let kind = entry
                .file_type()
                .map(EntryKind::of)
                .unwrap_or(EntryKind::Other);
            entries.push(DirEntryInfo {
                name,
                kind,
                size: metadata
                    .as_ref()
                    .filter(|_| kind == EntryKind::File)
                    .map(fs::Metadata::len),
                modified: metadata.and_then(|m| m.modified().ok()).map(timestamp),
            });
        }
        entries.sort_by(|a, b| {
            (a.kind != EntryKind::Directory, &a.name)
                .cmp(&(b.kind != EntryKind::Directory, &b.name))
        });
        let n_entries = entries.len();
        entries.truncate(limit);
        Ok(DirectoryListing {
            path: resolved.path.display().to_string(),
            truncated: n_entries > entries.len(),
            n_entries,
            entries,
            roots: roots
                .all()
                .iter()
                .map(|r| r.given.display().to_string())
                .collect(),
        })
    })
    .await
}

/// Gives details of one file or directory in the allowed folders: kind, size, times, read-only flag.
#[loadout::tool(
    domain = "filesystem",
    keywords = ["file info", "size", "modified", "stat", "exists", "파일 정보"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn file_info(args: PathArgs, ctx: &ToolContext) -> Result<FileInfo, ToolError> {
    let roots = load_roots(ctx).await?;
    blocking(move || {
        let resolved = roots.resolve(&args.path)?;
        require_exists(&resolved)?;
        let metadata = fs::metadata(&resolved.path).map_err(|e| io_error(&resolved.path, e))?;
        let link_target = fs::symlink_metadata(&resolved.lexical)
            .ok()
            .filter(|m| m.file_type().is_symlink())
            .map(|_| resolved.path.display().to_string());
        let kind = EntryKind::of(metadata.file_type());
        let n_entries = if kind == EntryKind::Directory {
            fs::read_dir(&resolved.path).ok().map(Iterator::count)
        } else {
            None
        };
        Ok(FileInfo {
            path: resolved.path.display().to_string(),
            kind,
            size: metadata.len(),
            modified: metadata.modified().ok().map(timestamp),
            created: metadata.created().ok().map(timestamp),
            readonly: metadata.permissions().readonly(),
            link_target,
            n_entries,
        })
    })
    .await
}

/// Finds files and folders by name pattern (`*`, `?`) under a directory in the allowed folders.
///
/// Searches subdirectories up to `max_depth` levels, does not follow symbolic links,
/// and returns at most `max_results` paths.
#[loadout::tool(
    domain = "filesystem",
    keywords = ["find", "search files", "locate", "glob", "where is", "파일 찾기"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn find_files(args: FindArgs, ctx: &ToolContext) -> Result<FindResult, ToolError> {
    let roots = load_roots(ctx).await?;
    let pattern = Pattern::new(&args.pattern, args.case_sensitive).map_err(ToolError::execution)?;
    let max_depth = bounded(args.max_depth, DEFAULT_FIND_DEPTH, MAX_FIND_DEPTH)?;
    let max_results = bounded(args.max_results, DEFAULT_FIND_RESULTS, MAX_FIND_RESULTS)?;
    blocking(move || {
        let resolved = roots.resolve(args.path.as_deref().unwrap_or(""))?;
        require_exists(&resolved)?;
        if !resolved.path.is_dir() {
            return Err(ToolError::execution(format!(
                "`{}` is not a directory",
                resolved.lexical.display()
            )));
        }
        let mut matches = Vec::new();
        let mut truncated = false;
        let mut scan_limited = false;
        let mut n_visited = 0usize;
        // Depth-first with an explicit stack: (directory, its path relative to the
        // start with `/` separators, its depth).
        let mut stack = vec![(resolved.path.clone(), String::new(), 0usize)];
        'walk: while let Some((dir, relative_dir, depth)) = stack.pop() {
            let Ok(read_dir) = fs::read_dir(&dir) else {
                continue;
            };
            let mut subdirs = Vec::new();
            for entry in read_dir.flatten() {
                n_visited += 1;
                if n_visited > MAX_FIND_VISITS {
                    scan_limited = true;
                    break 'walk;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                if !args.include_hidden && name.starts_with('.') {
                    continue;
                }
                let relative = if relative_dir.is_empty() {
                    name.clone()
                } else {
                    format!("{relative_dir}/{name}")
                };
                let kind = entry
                    .file_type()
                    .map(EntryKind::of)
                    .unwrap_or(EntryKind::Other);
                if pattern.matches(&relative, &name) {
                    if matches.len() == max_results {
                        truncated = true;
                        break 'walk;
                    }
                    let size = (kind == EntryKind::File)
                        .then(|| entry.metadata().ok().map(|m| m.len()))
                        .flatten();
                    matches.push(FoundFile {
                        path: entry.path().display().to_string(),
                        kind,
                        size,
                    });
                }
                // `file_type` does not follow links: a linked directory is not
                // entered, so the walk cannot leave the roots or loop.
                if kind == EntryKind::Directory && depth + 1 < max_depth {
                    subdirs.push((entry.path(), relative, depth + 1));
                }
            }
            subdirs.sort_by(|a, b| b.1.cmp(&a.1));
            stack.extend(subdirs);
        }
        matches.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(FindResult {
            directory: resolved.path.display().to_string(),
            pattern: args.pattern,
            matches,
            truncated,
            scan_limited,
        })
    })
    .await
}

/// Reads a text file in the allowed folders (up to 1 MiB by default); binary files are reported, not returned.
///
/// For larger files the response says `truncated` and gives `next_offset` to read on.
#[loadout::tool(
    domain = "filesystem",
    keywords = ["read", "open file", "cat", "contents", "view file", "파일 읽기"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn read_file(args: ReadArgs, ctx: &ToolContext) -> Result<FileContent, ToolError> {
    let roots = load_roots(ctx).await?;
    let max_bytes = match args.max_bytes {
        None => DEFAULT_READ_BYTES,
        Some(0) => return Err(ToolError::execution("`max_bytes` must be at least 1")),
        Some(n) => n.min(MAX_READ_BYTES),
    };
    blocking(move || {
        let resolved = roots.resolve(&args.path)?;
        require_exists(&resolved)?;
        if resolved.path.is_dir() {
            return Err(ToolError::execution(format!(
                "`{}` is a directory; use browse_directory",
                resolved.lexical.display()
            )));
        }
        let mut file = open_regular(&resolved, fs::OpenOptions::new().read(true))?;
        let size = file
            .metadata()
            .map_err(|e| io_error(&resolved.path, e))?
            .len();
        let offset = args.offset.unwrap_or(0).min(size);
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| io_error(&resolved.path, e))?;
        let mut bytes = Vec::new();
        file.take(max_bytes)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(&resolved.path, e))?;
        let end = offset + bytes.len() as u64;
        let truncated = end < size;
        let path = resolved.path.display().to_string();
        match decode_text(&bytes, truncated, offset > 0) {
            Some((text, n_used)) => {
                let end = offset + n_used as u64;
                Ok(FileContent {
                    path,
                    size,
                    content: Some(text),
                    binary: false,
                    offset,
                    n_bytes_read: n_used as u64,
                    truncated: end < size,
                    next_offset: (end < size).then_some(end),
                    note: None,
                })
            }
            None => Ok(FileContent {
                path,
                size,
                content: None,
                binary: true,
                offset,
                n_bytes_read: 0,
                truncated: false,
                next_offset: None,
                note: Some(
                    "this is a binary file (not UTF-8 text); its content is not returned".into(),
                ),
            }),
        }
    })
    .await
}

/// Writes a text file inside the allowed folders, creating it or (with `overwrite`) replacing it.
///
/// Refuses to replace an existing file unless `overwrite` is true, and to create
/// missing parent folders unless `create_dirs` is true.
#[loadout::tool(
    domain = "filesystem",
    keywords = ["write", "save file", "create file", "overwrite", "파일 저장"],
    read_only = false,
    destructive = true,
    idempotent = true,
    open_world = false
)]
pub async fn write_file(args: WriteArgs, ctx: &ToolContext) -> Result<FileWritten, ToolError> {
    let roots = load_roots(ctx).await?;
    if args.content.len() > MAX_WRITE_BYTES {
        return Err(ToolError::execution(format!(
            "the content is {} bytes; at most {MAX_WRITE_BYTES} per write",
            args.content.len()
        )));
    }
    check_new_name(&args.path)?;
    blocking(move || {
        let resolved = roots.resolve(&args.path)?;
        let display = resolved.lexical.display().to_string();
        if resolved.exists {
            if resolved.path.is_dir() {
                return Err(ToolError::execution(format!(
                    "`{display}` is a directory; give a file path"
                )));
            }
            require_regular(&resolved)?;
            if !args.overwrite {
                return Err(ToolError::execution(format!(
                    "`{display}` already exists; pass overwrite: true to replace it"
                )));
            }
        }
        let Some(parent) = resolved.path.parent() else {
            return Err(ToolError::execution(format!(
                "`{display}` has no parent directory"
            )));
        };
        if !parent.is_dir() {
            if !args.create_dirs {
                return Err(ToolError::execution(format!(
                    "the folder `{}` does not exist; pass create_dirs: true to create it",
                    parent.display()
                )));
            }
            fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
        }
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        let mut file = open_regular(&resolved, &mut options)?;
        std::io::Write::write_all(&mut file, args.content.as_bytes())
            .map_err(|e| io_error(&resolved.path, e))?;
        Ok(FileWritten {
            path: resolved.path.display().to_string(),
            n_bytes: args.content.len(),
            created: !resolved.exists,
        })
    })
    .await
}

// ---------------------------------------------------------------------------
// Helpers

/// A path `write_file` may create: no control character (a newline in a name breaks
/// every listing and script that reads one name per line) and no bidirectional
/// override or isolate (U+202A–U+202E, U+2066–U+2069: `invoice\u{202E}fdp.exe` shows
/// as `invoiceexe.pdf`).
fn check_new_name(path: &str) -> Result<(), ToolError> {
    let bad = path
        .chars()
        .find(|c| c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'));
    match bad {
        Some(c) => Err(ToolError::execution(format!(
            "the path contains U+{:04X}, a control or text-direction character; file names written here have neither",
            u32::from(c)
        ))),
        None => Ok(()),
    }
}

async fn load_roots(ctx: &ToolContext) -> Result<Roots, ToolError> {
    match ctx.settings().get(ROOTS_KEY).await? {
        Some(value) if !value.trim().is_empty() => Roots::parse(&value),
        _ => Err(ToolError::NotConfigured {
            domain: "filesystem".into(),
            missing: vec![ROOTS_KEY.into()],
        }),
    }
}

async fn blocking<R, F>(f: F) -> Result<R, ToolError>
where
    F: FnOnce() -> Result<R, ToolError> + Send + 'static,
    R: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::execution(format!("filesystem task failed: {e}")))?
}

fn bounded(given: Option<u32>, default: usize, max: usize) -> Result<usize, ToolError> {
    match given {
        None => Ok(default),
        Some(0) => Err(ToolError::execution("limits must be at least 1")),
        Some(n) => Ok((n as usize).min(max)),
    }
}

fn require_exists(resolved: &Resolved) -> Result<(), ToolError> {
    if resolved.exists {
        Ok(())
    } else {
        Err(ToolError::execution(format!(
            "`{}` does not exist",
            resolved.lexical.display()
        )))
    }
}

/// Refuses, without opening it, anything but a regular file: a FIFO would block the
/// call forever, a socket or a device is no file to read or write.
fn require_regular(resolved: &Resolved) -> Result<(), ToolError> {
    match fs::metadata(&resolved.path) {
        Ok(metadata) if !metadata.is_file() && !metadata.is_dir() => {
            Err(not_regular(resolved, metadata.file_type()))
        }
        _ => Ok(()),
    }
}

fn not_regular(resolved: &Resolved, file_type: fs::FileType) -> ToolError {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = if file_type.is_fifo() {
        "a named pipe (FIFO)"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    ToolError::execution(format!(
        "`{}` is {kind}; the file tools read and write regular files only",
        resolved.lexical.display()
    ))
}

/// Opens a regular file: checked before opening, then opened without blocking (a
/// FIFO put there in between cannot hold the call) and checked again on the handle.
fn open_regular(resolved: &Resolved, options: &mut fs::OpenOptions) -> Result<fs::File, ToolError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    require_regular(resolved)?;
    let file = options
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(&resolved.path)
        .map_err(|e| io_error(&resolved.path, e))?;
    let metadata = file.metadata().map_err(|e| io_error(&resolved.path, e))?;
    if !metadata.is_file() {
        return Err(not_regular(resolved, metadata.file_type()));
    }
    Ok(file)
}

fn io_error(path: &Path, e: std::io::Error) -> ToolError {
    ToolError::execution(format!("`{}`: {e}", path.display()))
}

fn timestamp(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The bytes as text and how many of them were used, or `None` for binary data. A
/// multi-byte character cut by the read limit is left for the next read; one cut by
/// the start offset is skipped.
fn decode_text(bytes: &[u8], cut_at_end: bool, cut_at_start: bool) -> Option<(String, usize)> {
    let sniff = &bytes[..bytes.len().min(8192)];
    if sniff.contains(&0) {
        return None;
    }
    let mut start = 0;
    if cut_at_start {
        while start < bytes.len().min(3) && (bytes[start] & 0b1100_0000) == 0b1000_0000 {
            start += 1;
        }
    }
    match std::str::from_utf8(&bytes[start..]) {
        Ok(text) => Some((text.to_owned(), bytes.len())),
        Err(e) if cut_at_end && e.error_len().is_none() => {
            let valid = start + e.valid_up_to();
            let text = String::from_utf8_lossy(&bytes[start..valid]).into_owned();
            Some((text, valid))
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests;
