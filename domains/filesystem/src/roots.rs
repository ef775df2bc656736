//! The allowed roots and the confinement of every path to them.
//!
//! A path is accepted only if, after resolving every symbolic link that exists, it
//! lies inside a canonicalized root. Components that do not exist yet (a file about
//! to be written) are plain names appended to the resolved ancestor, so they cannot
//! lead anywhere else. `..` is refused outright rather than interpreted.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use loadout::ToolError;

/// The setting that lists the roots.
pub const ROOTS_KEY: &str = "filesystem_roots";

/// One allowed directory: as configured, and with every link resolved.
#[derive(Debug, Clone)]
pub struct Root {
    pub given: PathBuf,
    pub canonical: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Roots {
    roots: Vec<Root>,
}

/// A path inside the roots.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Absolute, with every existing symbolic link resolved; operate on this.
    pub path: PathBuf,
    /// Whether the path exists (it may not, for a write).
    pub exists: bool,
    /// The path as the caller's root spells it (before resolving links), for messages.
    pub lexical: PathBuf,
}

fn malformed(message: impl std::fmt::Display) -> ToolError {
    ToolError::execution(format!(
        "setting `{ROOTS_KEY}` is malformed: {message}. Set it to a JSON array of absolute directory paths, e.g. [\"/home/me/Documents\"], or to absolute paths separated by `:`"
    ))
}

impl Roots {
    /// Parses the setting: a JSON array of absolute paths, or paths separated by the
    /// OS path separator. Every root must be an existing directory.
    pub fn parse(value: &str) -> Result<Roots, ToolError> {
        let value = value.trim();
        let paths: Vec<PathBuf> = if value.starts_with('[') {
            let list: Vec<String> = serde_json::from_str(value)
                .map_err(|e| malformed(format!("not a JSON array of strings ({e})")))?;
            list.into_iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
                .collect()
        } else {
            std::env::split_paths(value)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        };
        if paths.is_empty() {
            return Err(malformed("it lists no directory"));
        }
        let mut roots = Vec::with_capacity(paths.len());
        for given in paths {
            if !given.is_absolute() {
                return Err(malformed(format!(
                    "`{}` is not an absolute path",
                    given.display()
                )));
            }
            if given.components().any(|c| c == Component::ParentDir) {
                return Err(malformed(format!("`{}` contains `..`", given.display())));
            }
            let canonical = std::fs::canonicalize(&given)
                .map_err(|e| malformed(format!("`{}` cannot be opened ({e})", given.display())))?;
            if !canonical.is_dir() {
                return Err(malformed(format!(
                    "`{}` is not a directory",
                    given.display()
                )));
            }
            roots.push(Root { given, canonical });
        }
        Ok(Roots { roots })
    }

    pub fn all(&self) -> &[Root] {
        &self.roots
    }

    /// The first root: where relative paths start.
    pub fn first(&self) -> &Root {
        // `parse` refuses an empty list.
        &self.roots[0]
    }

    fn contains(&self, resolved: &Path) -> bool {
        self.roots
            .iter()
            .any(|r| resolved.starts_with(&r.canonical))
    }

    fn listing(&self) -> String {
        self.roots
            .iter()
            .map(|r| r.given.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Resolves a caller's path (relative to the first root, or absolute inside a
    /// root; empty means the first root) to a confined absolute path.
    pub fn resolve(&self, input: &str) -> Result<Resolved, ToolError> {
        let input = input.trim();
        let path = Path::new(if input.is_empty() { "." } else { input });
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(ToolError::execution(format!(
                "path `{input}` contains `..`, which is not allowed; give a path inside the allowed roots ({})",
                self.listing()
            )));
        }
        let (root, relative) = if path.is_absolute() {
            let found = self.roots.iter().find_map(|root| {
                path.strip_prefix(&root.given)
                    .or_else(|_| path.strip_prefix(&root.canonical))
                    .ok()
                    .map(|rest| (root, rest))
            });
            found.ok_or_else(|| {
                ToolError::execution(format!(
                    "path `{input}` is outside the allowed roots ({}); use a path inside one of them, or relative to the first",
                    self.listing()
                ))
            })?
        } else {
            (self.first(), path)
        };

        let mut lexical = root.given.clone();
        let mut candidate = root.canonical.clone();
        for component in relative.components() {
            match component {
                Component::Normal(name) => {
                    lexical.push(name);
                    candidate.push(name);
                }
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(ToolError::execution(format!(
                        "path `{input}` cannot be confined to the allowed roots"
                    )));
                }
            }
        }

        // The longest ancestor that exists (as an entry: a dangling link counts).
        let mut existing = candidate.clone();
        let mut missing: Vec<OsString> = Vec::new();
        loop {
            match std::fs::symlink_metadata(&existing) {
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    let Some(name) = existing.file_name().map(|n| n.to_os_string()) else {
                        return Err(ToolError::execution(format!(
                            "path `{input}` has no existing ancestor inside the roots"
                        )));
                    };
                    missing.push(name);
                    if !existing.pop() {
                        return Err(ToolError::execution(format!(
                            "path `{input}` has no existing ancestor inside the roots"
                        )));
                    }
                }
                Err(e) => {
                    return Err(ToolError::execution(format!(
                        "cannot inspect `{}`: {e}",
                        existing.display()
                    )));
                }
            }
        }
        let mut resolved = std::fs::canonicalize(&existing).map_err(|e| {
            ToolError::execution(format!(
                "path `{input}` goes through `{}`, which cannot be resolved (a broken symbolic link?): {e}",
                existing.display()
            ))
        })?;
        let exists = missing.is_empty();
        for name in missing.iter().rev() {
            resolved.push(name);
        }
        if !self.contains(&resolved) {
            return Err(ToolError::execution(format!(
                "path `{input}` leads through a symbolic link to `{}`, outside the allowed roots ({})",
                resolved.display(),
                self.listing()
            )));
        }
        Ok(Resolved {
            path: resolved,
            exists,
            lexical,
        })
    }
}
