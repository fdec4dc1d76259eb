//! The namespace journal behind `--lose-unsynced-dir-entries`. On a strict POSIX filesystem
//! a directory entry (a name created, removed or renamed) is durable only once its
//! directory is fsynced, whatever was done to the file itself: a program that creates a
//! file, fsyncs it and never fsyncs the directory can find the file gone after a power cut.
//! ext4's default journal happens to hide that mistake, so a test needs a filesystem that
//! does not.
//!
//! The journal records every namespace change whose directory has not been fsynced since,
//! keeps what a change removed (an unlinked file, a removed directory, a replaced rename
//! target) in a hidden trash directory of the backing tree instead of deleting it, and at a
//! crash undoes the changes newest first. A change becomes durable, and what it trashed is
//! deleted, when the directory holding its entry is fsynced; for a rename that is the
//! destination's directory (the name readers look the file up by), so a program that
//! fsyncs only the source directory sees its rename undone.
//!
//! Recorded paths always name where an entry is now: moving a directory (a rename, or a
//! removal into the trash and back) rewrites the recorded paths below it, so a change made
//! inside a directory that was renamed afterwards is undone in the right place, and made
//! durable by an fsync of that directory under its new name. An undo whose entry is no
//! longer where the change left it (a later change, already durable, moved or replaced it)
//! is skipped.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Permissions of the trash directory: only the daemon (root) looks inside.
const TRASH_MODE: u32 = 0o700;

/// One namespace change not yet durable. `ino` is the backing inode number, so an undo can
/// tell the entry it made from another one at the same path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// A name was created: create, mknod, mkdir or symlink.
    Created { path: PathBuf, ino: u64 },
    /// A name was removed (unlink, rmdir); what it named waits at `trashed`.
    Removed { path: PathBuf, trashed: PathBuf },
    /// `from` was renamed to `to`; the target it replaced, if any, waits at `replaced`.
    Renamed { from: PathBuf, to: PathBuf, ino: u64, replaced: Option<PathBuf> },
}

impl Change {
    /// The directory whose fsync makes this change durable.
    fn directory(&self) -> Option<&Path> {
        match self {
            Change::Created { path, .. } | Change::Removed { path, .. } => path.parent(),
            Change::Renamed { to, .. } => to.parent(),
        }
    }

    /// What this change keeps in the trash, deleted once the change is durable.
    fn trashed(&self) -> Option<&Path> {
        match self {
            Change::Created { .. } => None,
            Change::Removed { trashed, .. } => Some(trashed),
            Change::Renamed { replaced, .. } => replaced.as_deref(),
        }
    }

    /// Follows a move of the directory `old` to `new`: recorded paths strictly below `old`
    /// are now below `new`. A path equal to `old` names the moved entry itself, whose change
    /// stays recorded where it was made (the rename is a change of its own).
    fn moved(&mut self, old: &Path, new: &Path) {
        let paths = match self {
            Change::Created { path, .. } | Change::Removed { path, .. } => [Some(path), None],
            Change::Renamed { from, to, .. } => [Some(from), Some(to)],
        };
        for path in paths.into_iter().flatten() {
            if let Some(below) = strictly_below(path, old) {
                *path = new.join(below);
            }
        }
    }
}

/// `path` relative to `dir` when `path` is inside `dir` (and not `dir` itself).
fn strictly_below<'a>(path: &'a Path, dir: &Path) -> Option<&'a Path> {
    path.strip_prefix(dir).ok().filter(|below| !below.as_os_str().is_empty())
}

fn exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// Whether `path` names the backing inode `ino`.
fn holds(path: &Path, ino: u64) -> bool {
    fs::symlink_metadata(path).is_ok_and(|meta| meta.ino() == ino)
}

/// Deletes `path`, a whole directory tree or a single entry, if it exists.
fn remove_entry(path: &Path) -> io::Result<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(error) => Err(error),
    };
    match result {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn os_error(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// The errors unlink(2) (`directory` false) or rmdir(2) would give for `path`; the trash
/// takes the entry by a rename, which would not check them.
fn check_removable(path: &Path, meta: &fs::Metadata, directory: bool) -> io::Result<()> {
    match (directory, meta.is_dir()) {
        (false, true) => Err(os_error(libc::EISDIR)),
        (true, false) => Err(os_error(libc::ENOTDIR)),
        (true, true) if fs::read_dir(path)?.next().is_some() => Err(os_error(libc::ENOTEMPTY)),
        _ => Ok(()),
    }
}

/// The errors rename(2) would give for replacing `target` (at `to`) by `source`; the target
/// goes to the trash first, after which the rename itself would not check them.
fn check_replaceable(source: &fs::Metadata, target: &fs::Metadata, to: &Path) -> io::Result<()> {
    match (source.is_dir(), target.is_dir()) {
        (false, true) => Err(os_error(libc::EISDIR)),
        (true, false) => Err(os_error(libc::ENOTDIR)),
        (true, true) if fs::read_dir(to)?.next().is_some() => Err(os_error(libc::ENOTEMPTY)),
        _ => Ok(()),
    }
}

/// What a crash did to the journal's changes.
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Undone {
    /// Changes undone.
    pub changes: u64,
    /// Changes whose entry a later, durable change had moved: left as they are.
    pub skipped: u64,
}

/// The namespace changes not yet durable, oldest first (see the module doc).
pub struct Journal {
    /// The hidden trash directory, created when first needed and deleted when emptied.
    trash: PathBuf,
    changes: Vec<Change>,
    next_trash_id: u64,
}

impl Journal {
    /// A journal keeping removed entries in `trash`; what a previous run left there is
    /// deleted (that run's journal is gone, so nothing could be put back).
    pub fn new(trash: PathBuf) -> io::Result<Journal> {
        remove_entry(&trash)?;
        Ok(Journal { trash, changes: Vec::new(), next_trash_id: 0 })
    }

    /// How many changes are not durable yet.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.changes.len()
    }

    /// Records that `path` was just created (the caller created it).
    pub fn created(&mut self, path: &Path) -> io::Result<()> {
        let ino = fs::symlink_metadata(path)?.ino();
        self.changes.push(Change::Created { path: path.to_path_buf(), ino });
        Ok(())
    }

    /// Removes `path` as unlink(2), or as rmdir(2) when `directory`, keeping it in the trash.
    pub fn remove(&mut self, path: &Path, directory: bool) -> io::Result<()> {
        let meta = fs::symlink_metadata(path)?;
        check_removable(path, &meta, directory)?;
        let trashed = self.trash_slot()?;
        fs::rename(path, &trashed)?;
        self.moved(path, &trashed);
        self.changes.push(Change::Removed { path: path.to_path_buf(), trashed });
        Ok(())
    }

    /// Renames `from` to `to` as rename(2), keeping a replaced target in the trash.
    pub fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let source = fs::symlink_metadata(from)?;
        let replaced = match fs::symlink_metadata(to) {
            // Two names of one file: rename(2) does nothing.
            Ok(target) if target.dev() == source.dev() && target.ino() == source.ino() => return Ok(()),
            Ok(target) => {
                check_replaceable(&source, &target, to)?;
                let trashed = self.trash_slot()?;
                fs::rename(to, &trashed)?;
                Some(trashed)
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        };
        if let Err(error) = fs::rename(from, to) {
            if let Some(trashed) = &replaced {
                fs::rename(trashed, to)?;
            }
            return Err(error);
        }
        if let Some(trashed) = &replaced {
            self.moved(to, trashed);
        }
        self.moved(from, to);
        self.changes.push(Change::Renamed {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            ino: source.ino(),
            replaced,
        });
        Ok(())
    }

    /// The directory `dir` was fsynced: the changes of its entries are durable, and what
    /// they kept in the trash is deleted.
    pub fn dir_synced(&mut self, dir: &Path) -> io::Result<()> {
        let (durable, pending): (Vec<Change>, Vec<Change>) =
            std::mem::take(&mut self.changes).into_iter().partition(|change| change.directory() == Some(dir));
        self.changes = pending;
        for change in &durable {
            if let Some(trashed) = change.trashed() {
                remove_entry(trashed)?;
            }
        }
        Ok(())
    }

    /// Everything is durable (a global `sync`, an unmount): forgets every change and
    /// deletes the trash.
    pub fn make_durable(&mut self) -> io::Result<()> {
        self.changes.clear();
        remove_entry(&self.trash)
    }

    /// A power cut: undoes every change, newest first, then deletes the trash.
    pub fn undo_all(&mut self) -> Undone {
        let mut undone = Undone::default();
        while let Some(change) = self.changes.pop() {
            match self.undo(change.clone()) {
                Ok(true) => undone.changes += 1,
                Ok(false) => undone.skipped += 1,
                Err(error) => {
                    eprintln!("lossyfs: crash: could not undo {change:?}: {error}");
                    undone.skipped += 1;
                }
            }
        }
        if let Err(error) = remove_entry(&self.trash) {
            eprintln!("lossyfs: crash: could not empty the trash {}: {error}", self.trash.display());
        }
        assert!(self.changes.is_empty(), "a crash leaves nothing to undo");
        undone
    }

    /// Undoes one change; false when its entry is no longer where the change left it.
    fn undo(&mut self, change: Change) -> io::Result<bool> {
        match change {
            Change::Created { path, ino } => {
                if !holds(&path, ino) {
                    return Ok(false);
                }
                remove_entry(&path)?;
                Ok(true)
            }
            Change::Removed { path, trashed } => {
                if exists(&path) || !exists(&trashed) {
                    return Ok(false);
                }
                fs::rename(&trashed, &path)?;
                self.moved(&trashed, &path);
                Ok(true)
            }
            Change::Renamed { from, to, ino, replaced } => {
                let moved_back = holds(&to, ino) && !exists(&from);
                if moved_back {
                    fs::rename(&to, &from)?;
                    self.moved(&to, &from);
                }
                let restored = match replaced {
                    Some(trashed) if !exists(&to) && exists(&trashed) => {
                        fs::rename(&trashed, &to)?;
                        self.moved(&trashed, &to);
                        true
                    }
                    _ => false,
                };
                Ok(moved_back || restored)
            }
        }
    }

    /// Rewrites the recorded paths below `old`, which just moved to `new`.
    fn moved(&mut self, old: &Path, new: &Path) {
        for change in &mut self.changes {
            change.moved(old, new);
        }
    }

    /// A fresh name in the trash, creating the trash directory if needed.
    fn trash_slot(&mut self) -> io::Result<PathBuf> {
        if !exists(&self.trash) {
            fs::DirBuilder::new().mode(TRASH_MODE).create(&self.trash)?;
        }
        let slot = self.trash.join(self.next_trash_id.to_string());
        self.next_trash_id += 1;
        assert!(!exists(&slot), "trash slots are never reused");
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backing tree with a journal, and helpers naming paths inside it.
    struct Tree {
        dir: tempfile::TempDir,
        journal: Journal,
    }

    impl Tree {
        fn new() -> Tree {
            let dir = tempfile::tempdir().unwrap();
            let journal = Journal::new(dir.path().join(".trash")).unwrap();
            Tree { dir, journal }
        }

        fn path(&self, name: &str) -> PathBuf {
            if name.is_empty() {
                self.dir.path().to_path_buf()
            } else {
                self.dir.path().join(name)
            }
        }

        fn create(&mut self, name: &str, content: &str) {
            fs::write(self.path(name), content).unwrap();
            self.journal.created(&self.path(name)).unwrap();
        }

        fn mkdir(&mut self, name: &str) {
            fs::create_dir(self.path(name)).unwrap();
            self.journal.created(&self.path(name)).unwrap();
        }

        fn rename(&mut self, from: &str, to: &str) {
            self.journal.rename(&self.path(from), &self.path(to)).unwrap();
        }

        fn sync_dir(&mut self, name: &str) {
            self.journal.dir_synced(&self.path(name)).unwrap();
        }

        fn crash(&mut self) -> Undone {
            self.journal.undo_all()
        }

        /// Every entry below the root, as `name` or `name=content`, sorted.
        fn listing(&self) -> Vec<String> {
            let mut out = Vec::new();
            let mut stack = vec![self.path("")];
            while let Some(dir) = stack.pop() {
                for entry in fs::read_dir(&dir).unwrap() {
                    let path = entry.unwrap().path();
                    let name = path.strip_prefix(self.dir.path()).unwrap().display().to_string();
                    if path.is_dir() {
                        stack.push(path);
                        out.push(format!("{name}/"));
                    } else {
                        out.push(format!("{name}={}", fs::read_to_string(&path).unwrap()));
                    }
                }
            }
            out.sort();
            out
        }

        fn check(&self, expected: &[&str]) {
            assert_eq!(self.listing(), expected);
        }
    }

    #[test]
    fn a_creation_survives_only_an_fsync_of_its_directory() {
        let mut tree = Tree::new();
        tree.mkdir("d");
        tree.sync_dir("");
        tree.create("d/lost", "x");
        tree.create("kept-by-root", "y");
        tree.sync_dir("");
        assert_eq!(tree.journal.pending(), 1);
        assert_eq!(tree.crash(), Undone { changes: 1, skipped: 0 });
        tree.check(&["d/", "kept-by-root=y"]);
    }

    #[test]
    fn an_unlink_and_a_replacing_rename_come_back_with_their_content() {
        let mut tree = Tree::new();
        fs::write(tree.path("a"), "old a").unwrap();
        fs::write(tree.path("b"), "old b").unwrap();
        fs::write(tree.path("gone"), "old gone").unwrap();
        tree.journal.remove(&tree.path("gone"), false).unwrap();
        tree.rename("a", "b");
        tree.check(&[".trash/", ".trash/0=old gone", ".trash/1=old b", "b=old a"]);
        tree.crash();
        tree.check(&["a=old a", "b=old b", "gone=old gone"]);
    }

    #[test]
    fn a_durable_removal_deletes_what_it_trashed() {
        let mut tree = Tree::new();
        fs::write(tree.path("a"), "a").unwrap();
        fs::write(tree.path("b"), "b").unwrap();
        tree.rename("a", "b");
        tree.sync_dir("");
        tree.check(&[".trash/", "b=a"]);
        assert_eq!(tree.crash(), Undone::default());
        tree.check(&["b=a"]);
    }

    #[test]
    fn a_global_sync_makes_every_change_durable() {
        let mut tree = Tree::new();
        tree.mkdir("d");
        tree.create("d/f", "f");
        tree.rename("d/f", "g");
        tree.journal.remove(&tree.path("d"), true).unwrap();
        tree.journal.make_durable().unwrap();
        tree.check(&["g=f"]);
        assert_eq!(tree.crash(), Undone::default());
        tree.check(&["g=f"]);
    }

    #[test]
    fn undoing_a_mkdir_takes_what_was_made_inside_even_if_that_was_synced() {
        let mut tree = Tree::new();
        tree.mkdir("d");
        tree.mkdir("d/e");
        tree.create("d/e/f", "data");
        tree.sync_dir("d/e");
        tree.sync_dir("d");
        assert_eq!(tree.journal.pending(), 1, "only d's own entry is pending");
        tree.crash();
        tree.check(&[]);
    }

    /// A directory filled under a temporary name, renamed, and the rename made durable:
    /// its entries are durable only by an fsync of the directory (under either name).
    fn check_filled_then_renamed(sync_renamed_directory: bool, expected: &[&str]) {
        let mut tree = Tree::new();
        tree.mkdir("tmp");
        tree.sync_dir("");
        tree.create("tmp/segment", "s");
        tree.create("tmp/index", "i");
        tree.rename("tmp", "final");
        tree.sync_dir("");
        if sync_renamed_directory {
            tree.sync_dir("final");
        }
        tree.create("final/late", "l");
        tree.crash();
        tree.check(expected);
    }

    #[test]
    fn changes_inside_a_renamed_directory_follow_it() {
        check_filled_then_renamed(false, &["final/"]);
        check_filled_then_renamed(true, &["final/", "final/index=i", "final/segment=s"]);
    }

    #[test]
    fn an_undone_rename_of_a_directory_puts_changes_inside_back_in_place() {
        let mut tree = Tree::new();
        tree.mkdir("d");
        fs::write(tree.path("d/f"), "f").unwrap();
        tree.sync_dir("");
        tree.journal.remove(&tree.path("d/f"), false).unwrap();
        tree.rename("d", "e");
        tree.crash();
        tree.check(&["d/", "d/f=f"]);
    }

    #[test]
    fn an_undo_skips_an_entry_a_durable_change_moved_away() {
        let mut tree = Tree::new();
        tree.mkdir("a");
        tree.mkdir("b");
        tree.sync_dir("");
        tree.create("a/x", "x");
        tree.rename("a/x", "b/x");
        tree.sync_dir("b");
        assert_eq!(tree.crash(), Undone { changes: 0, skipped: 1 });
        tree.check(&["a/", "b/", "b/x=x"]);
    }

    #[test]
    fn removal_and_rename_report_the_errors_of_the_system_calls() {
        let mut tree = Tree::new();
        tree.mkdir("d");
        tree.create("d/f", "f");
        tree.create("g", "g");
        let code = |result: io::Result<()>| result.unwrap_err().raw_os_error();
        assert_eq!(code(tree.journal.remove(&tree.path("d"), false)), Some(libc::EISDIR));
        assert_eq!(code(tree.journal.remove(&tree.path("g"), true)), Some(libc::ENOTDIR));
        assert_eq!(code(tree.journal.remove(&tree.path("d"), true)), Some(libc::ENOTEMPTY));
        assert_eq!(code(tree.journal.rename(&tree.path("g"), &tree.path("d"))), Some(libc::EISDIR));
        assert_eq!(code(tree.journal.rename(&tree.path("d"), &tree.path("g"))), Some(libc::ENOTDIR));
        assert_eq!(code(tree.journal.rename(&tree.path("d"), &tree.path("d/f/x"))), Some(libc::ENOTDIR));
        assert_eq!(tree.journal.pending(), 3, "failed calls record nothing");
        tree.check(&["d/", "d/f=f", "g=g"]);
    }
}
