//! A policy source: one file, or a directory of policy files (a Kubernetes ConfigMap mounted as a
//! directory, one key per team), merged into one set.
//!
//! In a directory, every `*.yaml` / `*.yml` entry whose name does not start with `.` is a policy
//! file, read in name order; the kubelet's own entries (`..data`, `..2026_...`) are skipped while
//! the keys it links through them (`key -> ..data/key`) are followed. Each file is bounded like a
//! single policy file (`files.max_bytes`, `files.read_timeout`, regular files only), at most
//! [`MAX_FILES`] of them and `files.max_bytes` together. A name defined in two files is refused naming both places, and one bad
//! file refuses the whole source: the set in force keeps serving (see `reload`).

use std::borrow::Cow;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::bounded_read::{self, FileStamp, ReadError};
use super::yaml_lines::PolicyLines;
use super::{parse_policies, policy_file_version, PolicyFileError, Problem};
use crate::config::FileLimits;
use crate::limit::PolicySet;

/// Most policy files one directory may hold.
pub const MAX_FILES: usize = 256;

/// How often a directory is read again when it changed while being read (the kubelet swapped
/// `..data` half-way) before the read is given up until the next poll.
const READ_ATTEMPTS: usize = 3;

/// One text to parse: its file, the text (a file's own, or several Envoy files converted
/// together), and whether its lines are the file's.
type Unit<'a> = (&'a Path, Cow<'a, str>, bool);

/// What identifies one version of a source without reading it: every file's name and stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceStamp(Vec<(OsString, FileStamp)>);

/// A source's content: each file's path and text, in the order they are merged.
#[derive(Debug, Clone)]
pub struct SourceText {
    /// Whether the source is a directory (its version then covers the file names too).
    pub is_dir: bool,
    /// `(path, text)` of each file.
    pub files: Vec<(PathBuf, String)>,
}

impl SourceText {
    /// The version exported as `sluice_policies_version`: a single file's is
    /// [`policy_file_version`] of its text; a directory's covers every name and text.
    pub fn version(&self) -> u32 {
        match (self.is_dir, self.files.as_slice()) {
            (false, [(_, text)]) => policy_file_version(text),
            _ => {
                let mut all = String::new();
                for (path, text) in &self.files {
                    let name = path.file_name().unwrap_or_default().to_string_lossy();
                    all.push_str(&format!("{name}\0{}\0{text}", text.len()));
                }
                policy_file_version(&all)
            }
        }
    }

    /// What is parsed: each sluice policy file as it is, and the envoyproxy/ratelimit files of a
    /// directory converted together, at the place of the first of them, so that one domain may
    /// be split over several files (upstream's `MERGE_DOMAIN_CONFIG`; a key and value given twice
    /// at one level is still refused). Each unit says whether its text is a file's own (its lines
    /// are the file's).
    fn units(&self) -> Result<Vec<Unit<'_>>, PolicyFileError> {
        // Every file is bounded before anything is read from it (which format it is included).
        for (path, text) in &self.files {
            super::check_expansion(text).map_err(|e| PolicyFileError {
                file: path.clone(),
                problems: vec![Problem::at(e.line, e.to_string())],
            })?;
        }
        let is_envoy = |text: &str| super::envoy::is_envoy_config(text);
        let envoy: Vec<(&Path, &str)> = self
            .files
            .iter()
            .filter(|(_, text)| is_envoy(text))
            .map(|(path, text)| (path.as_path(), text.as_str()))
            .collect();
        if envoy.len() < 2 {
            return Ok(self
                .files
                .iter()
                .map(|(path, text)| (path.as_path(), Cow::Borrowed(text.as_str()), true))
                .collect());
        }
        let first = envoy[0].0;
        let fail = |file: &Path, problems: Vec<Problem>| PolicyFileError {
            file: file.to_owned(),
            problems,
        };
        let merged = super::envoy::convert_sources(&envoy, super::envoy::DomainMerge::Merge)
            .map_err(|problems| fail(first, problems.into_iter().map(Problem::from).collect()))?;
        let mut units = Vec::with_capacity(self.files.len());
        let mut merged = Some(merged);
        for (path, text) in &self.files {
            if !is_envoy(text) {
                units.push((path.as_path(), Cow::Borrowed(text.as_str()), true));
            } else if let Some(converted) = merged.take() {
                units.push((first, Cow::Owned(converted), false));
            }
        }
        Ok(units)
    }

    /// Validates every file and merges their policies, in file then policy order.
    pub fn parse(&self) -> Result<PolicySet, PolicyFileError> {
        let mut policies = Vec::new();
        // Where each name was defined: (file, line).
        let mut defined: Vec<(String, &Path, Option<usize>)> = Vec::new();
        let units = self.units()?;
        for (path, text, own_lines) in &units {
            let (path, text) = (*path, text.as_ref());
            let set = parse_policies(path, text)?;
            let lines = (*own_lines && !super::envoy::is_envoy_config(text))
                .then(|| PolicyLines::new(text, set.len()));
            for (index, policy) in set.iter().enumerate() {
                let line = lines.as_ref().and_then(|l| l.policy(index));
                if let Some((_, first, first_line)) =
                    defined.iter().find(|(name, ..)| name == policy.name())
                {
                    let at = match first_line {
                        Some(n) => format!("{}:{n}", first.display()),
                        None => first.display().to_string(),
                    };
                    return Err(PolicyFileError {
                        file: path.to_owned(),
                        problems: vec![Problem {
                            line,
                            message: format!(
                                "policy `{}`: field `name`: already defined in {at} (one name, \
                                 one file)",
                                policy.name()
                            ),
                        }],
                    });
                }
                defined.push((policy.name().to_owned(), path, line));
                policies.push((**policy).clone());
            }
        }
        PolicySet::new(policies).map_err(|name| PolicyFileError {
            file: self
                .files
                .first()
                .map_or_else(PathBuf::new, |f| f.0.clone()),
            problems: vec![Problem::from(format!(
                "policy `{name}`: field `name`: defined more than once"
            ))],
        })
    }
}

/// The policy files of `path`: itself, or a directory's policy files in name order.
pub fn files(path: &Path) -> Result<Vec<PathBuf>, ReadError> {
    let error = |reason: String| ReadError {
        path: path.to_owned(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| error(e.to_string()))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| error(e.to_string()))? {
        let name = entry.map_err(|e| error(e.to_string()))?.file_name();
        if is_policy_file(&name) {
            if names.len() == MAX_FILES {
                return Err(error(format!("more than {MAX_FILES} policy files")));
            }
            names.push(name);
        }
    }
    names.sort();
    Ok(names.into_iter().map(|name| path.join(name)).collect())
}

/// `*.yaml` or `*.yml`, not hidden (the kubelet's `..data` and its timestamped directories).
fn is_policy_file(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

/// The stamp of the source at `path`, reading no file.
pub fn stamp(path: &Path, limits: &FileLimits) -> Result<SourceStamp, ReadError> {
    let mut stamps = Vec::new();
    for file in files(path)? {
        let stamp = bounded_read::stamp(&file, limits)?;
        stamps.push((file.file_name().unwrap_or_default().to_owned(), stamp));
    }
    Ok(SourceStamp(stamps))
}

/// Reads every file of the source within the bounds; a directory that changes while being read
/// is read again (a few times), so that the files come from one version.
pub fn read(path: &Path, limits: &FileLimits) -> Result<(SourceText, SourceStamp), ReadError> {
    let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
    for _ in 0..READ_ATTEMPTS {
        let mut files = Vec::new();
        let mut stamps = Vec::new();
        let mut total = 0u64;
        for file in self::files(path)? {
            let (text, stamp) = bounded_read::read(&file, limits)?;
            // The whole source, not only each file, stays within files.max_bytes.
            total += text.len() as u64;
            if total > limits.max_bytes {
                return Err(ReadError {
                    path: path.to_owned(),
                    reason: format!(
                        "its files together are over files.max_bytes ({})",
                        limits.max_bytes
                    ),
                });
            }
            stamps.push((file.file_name().unwrap_or_default().to_owned(), stamp));
            files.push((file, text));
        }
        let stamp = SourceStamp(stamps);
        if !is_dir || self::stamp(path, limits).as_ref() == Ok(&stamp) {
            return Ok((SourceText { is_dir, files }, stamp));
        }
    }
    Err(ReadError {
        path: path.to_owned(),
        reason: format!("changed while being read, {READ_ATTEMPTS} times"),
    })
}

/// Reads and validates the source at `path`; also returns its version.
pub fn load(path: &Path, limits: &FileLimits) -> Result<(PolicySet, u32), PolicyFileError> {
    let (text, _) = read(path, limits).map_err(|e| PolicyFileError {
        file: e.path.clone(),
        problems: vec![Problem::from(format!("cannot read: {}", e.reason))],
    })?;
    Ok((text.parse()?, text.version()))
}

/// [`read`] from async code, off the worker threads.
pub async fn read_async(
    path: PathBuf,
    limits: FileLimits,
) -> Result<(SourceText, SourceStamp), ReadError> {
    bounded_read::off_thread(path, move |path| read(path, &limits)).await
}

/// [`stamp`] from async code, off the worker threads.
pub async fn stamp_async(path: PathBuf, limits: FileLimits) -> Result<SourceStamp, ReadError> {
    bounded_read::off_thread(path, move |path| stamp(path, &limits)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str =
        "policies:\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 1, period: 1m}\n";
    const B: &str = "policies:\n  - {name: b, key: [ip], algorithm: fixed_window, limit: 2, period: 1m}\n  - {name: a, key: [ip], algorithm: fixed_window, limit: 3, period: 1m}\n";

    #[test]
    fn a_directory_merges_its_yaml_files_in_name_order_and_skips_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("b-team.yml"),
            &B[..B.rfind("  - {name: a").unwrap()],
        )
        .expect("write");
        std::fs::write(dir.path().join("a-team.yaml"), A).expect("write");
        std::fs::write(dir.path().join("README"), "not policies").expect("write");
        std::fs::create_dir(dir.path().join("..2026_01_01")).expect("mkdir");
        std::fs::write(dir.path().join(".hidden.yaml"), "broken: [").expect("write");
        let (set, version) = load(dir.path(), &FileLimits::default()).expect("loads");
        let names: Vec<&str> = set.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["a", "b"]);
        std::fs::write(dir.path().join("c.yaml"), "policies: []\n").expect("write");
        let (_, changed) = load(dir.path(), &FileLimits::default()).expect("loads");
        assert_ne!(version, changed, "a new file is a new version");
    }

    #[test]
    fn a_name_in_two_files_names_both_places() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("1.yaml"), A).expect("write");
        std::fs::write(dir.path().join("2.yaml"), B).expect("write");
        let error = load(dir.path(), &FileLimits::default()).expect_err("refused");
        let text = error.to_string();
        let first = format!("{}:2", dir.path().join("1.yaml").display());
        let second = format!("{}:3:", dir.path().join("2.yaml").display());
        assert!(text.starts_with(&second), "{text}");
        assert!(text.contains(&first), "{text}");
    }

    #[test]
    fn the_files_together_stay_within_the_byte_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.yaml"), A).expect("write");
        std::fs::write(dir.path().join("b.yaml"), A.replace("name: a", "name: b")).expect("write");
        let limits = FileLimits {
            max_bytes: A.len() as u64 + 10,
            ..FileLimits::default()
        };
        let error = read(dir.path(), &limits).expect_err("two files over the bound");
        assert!(error.reason.contains("together"), "{}", error.reason);
        assert!(read(dir.path(), &FileLimits::default()).is_ok());
    }

    #[test]
    fn envoy_files_of_one_domain_are_merged_and_a_repeated_entry_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let limit = |key: &str, n: u32| {
            format!("domain: rl\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: minute, requests_per_unit: {n}}}\n")
        };
        std::fs::write(dir.path().join("a.yaml"), limit("k1", 5)).expect("write");
        std::fs::write(dir.path().join("b.yaml"), limit("k2", 7)).expect("write");
        std::fs::write(dir.path().join("c.yaml"), A).expect("write");
        let (set, _) = load(dir.path(), &FileLimits::default()).expect("one domain over two files");
        assert!(set.iter().any(|p| p.name() == "a"), "the sluice file too");
        assert!(set.len() >= 3, "{} policies", set.len());
        std::fs::write(dir.path().join("b.yaml"), limit("k1", 7)).expect("write");
        let error = load(dir.path(), &FileLimits::default()).expect_err("k1 twice");
        assert!(error.to_string().contains("a.yaml"), "{error}");
    }

    #[test]
    fn a_single_file_keeps_its_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.yaml");
        std::fs::write(&path, A).expect("write");
        let (_, version) = load(&path, &FileLimits::default()).expect("loads");
        assert_eq!(version, policy_file_version(A));
    }
}
