//! The data directory and the secrets toolfleet keeps in it (the
//! confirm-token key, the webhook key, the development token).
//!
//! On unix the directory is made owner-only (0700), and an existing one that
//! group or others may write in is refused: they could plant or swap what
//! toolfleet reads there. An existing directory is otherwise used as it is.
//! Every secret is written to a file created owner-only (0600) before its
//! first byte, and a secret file that group or others may read is refused.
//! (The SQLite store makes its own files owner-only: see
//! `toolfleet_store::sqlite::SqliteStore::open`.)

use std::io::{Read, Write};
use std::path::Path;

/// Makes `dir` (and any missing parent) owner-only, or checks an existing
/// one: refused if group or others may write in it.
pub(crate) fn data_dir(dir: &Path) -> Result<(), String> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(dir)
        .map_err(|e| format!("cannot create data_dir {}: {e}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)
            .map_err(|e| format!("cannot read data_dir {}: {e}", dir.display()))?
            .permissions()
            .mode();
        if mode & 0o022 != 0 {
            return Err(format!(
                "data_dir {dir} may be written by group or others (mode {mode:04o}), and toolfleet keeps its database and secrets there: chmod 700 {dir}",
                dir = dir.display(),
                mode = mode & 0o7777,
            ));
        }
    }
    Ok(())
}

/// What a secret's file holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// No file.
    Missing,
    /// A file with nothing but white space (never written by this version).
    Empty,
    /// The secret, trimmed.
    Secret(String),
}

/// Reads the secret in `path`. A file that group or others may read or
/// change is refused, with the command that makes it owner-only.
pub(crate) fn read_secret(path: &Path) -> Result<Kept, String> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Kept::Missing),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = file
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "{path} holds a secret and group or others may read it (mode {mode:04o}): chmod 600 {path} (or delete it, and toolfleet makes a new one)",
                path = path.display(),
                mode = mode & 0o7777,
            ));
        }
    }
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = text.trim();
    Ok(if text.is_empty() {
        Kept::Empty
    } else {
        Kept::Secret(text.to_owned())
    })
}

/// Keeps `value` in `path`, which must not exist: written whole to a file
/// created owner-only beside it, then linked into place, so that no other
/// process ever reads it half written, nor replaces one it made first.
/// Answers the secret kept (the other process's when it came first) and
/// whether it is `value`.
pub(crate) fn keep_secret(path: &Path, value: &str) -> Result<(String, bool), String> {
    let cannot = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&temporary).and_then(|mut file| {
        file.write_all(format!("{value}\n").as_bytes())?;
        file.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(cannot(e));
    }
    let linked = match std::fs::hard_link(&temporary, path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(e),
        // A file system without hard links: replacing is the one way left.
        Err(_) => std::fs::rename(&temporary, path),
        ok => ok,
    };
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => Ok((value.to_owned(), true)),
        // Another process kept one first: use it.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match read_secret(path)? {
            Kept::Secret(kept) => Ok((kept, false)),
            Kept::Missing | Kept::Empty => Err(cannot(e)),
        },
        Err(e) => Err(cannot(e)),
    }
}

/// The secret kept as `name` in `dir`, made with `make()` when there is
/// none: answers it and whether it was just made.
pub(crate) fn kept_secret(
    dir: &Path,
    name: &str,
    make: impl FnOnce() -> String,
) -> Result<(String, bool), String> {
    data_dir(dir)?;
    let path = dir.join(name);
    match read_secret(&path)? {
        Kept::Secret(secret) => return Ok((secret, false)),
        // Left by a write that stopped half way: made again.
        Kept::Empty => std::fs::remove_file(&path)
            .map_err(|e| format!("cannot replace the empty {}: {e}", path.display()))?,
        Kept::Missing => {}
    }
    keep_secret(&path, &make())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "toolfleet-files-{name}-{}",
            uuid::Uuid::now_v7().simple()
        ))
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_secret_is_made_owner_only_once_and_kept() {
        let dir = temp("kept").join("data");
        let (made, new) = kept_secret(&dir, "secret", || "first".to_owned()).unwrap();
        assert_eq!((made.as_str(), new), ("first", true));
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("secret")), 0o600);
        let (kept, new) = kept_secret(&dir, "secret", || "second".to_owned()).unwrap();
        assert_eq!((kept.as_str(), new), ("first", false));
        // Nothing but the secret is left beside it.
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_secret_made_by_another_process_first_is_used() {
        let dir = temp("race");
        data_dir(&dir).unwrap();
        let path = dir.join("secret");
        assert_eq!(keep_secret(&path, "one").unwrap(), ("one".to_owned(), true));
        assert_eq!(
            keep_secret(&path, "two").unwrap(),
            ("one".to_owned(), false)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_secret_file_is_made_again() {
        let dir = temp("empty");
        data_dir(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (made, new) = kept_secret(&dir, "secret", || "fresh".to_owned()).unwrap();
        assert_eq!((made.as_str(), new), ("fresh", true));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_secret_others_may_read_is_refused_with_the_fix() {
        let dir = temp("open");
        data_dir(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "visible\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let refused = kept_secret(&dir, "secret", || unreachable!()).unwrap_err();
        assert!(
            refused.contains(&format!("chmod 600 {}", path.display())) && refused.contains("0640"),
            "{refused}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_secret(&path).unwrap(),
            Kept::Secret("visible".to_owned())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_data_dir_others_may_write_in_is_refused_and_a_readable_one_kept() {
        let dir = temp("shared");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        let refused = data_dir(&dir).unwrap_err();
        assert!(
            refused.contains(&format!("chmod 700 {}", dir.display())),
            "{refused}"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        data_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o755, "an existing directory is left as it is");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
