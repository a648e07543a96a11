//! `listen.socket_group`: the group the Unix sockets are given, so that a proxy running as
//! another user (nginx workers as `www-data` or `nobody` on a plain VM) can connect to a socket
//! of mode `0660` without opening it to every local user. Read once, at settings load: a name
//! from `/etc/group` or a numeric id; anything else is a settings error (exit 64).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where group names are looked up.
const GROUP_FILE: &str = "/etc/group";
/// Largest group file read (a system file; far above any real one).
const MAX_GROUP_FILE: u64 = 4 << 20;

/// A group, as written and as its numeric id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketGroup {
    /// The name or number as written in the settings.
    pub written: String,
    /// The group id the socket files are given.
    pub gid: u32,
}

impl SocketGroup {
    /// Reads `text`: digits are a group id, anything else a name looked up in `/etc/group`.
    pub fn resolve(text: &str) -> Result<Self, String> {
        Self::resolve_in(text, std::path::Path::new(GROUP_FILE))
    }

    fn resolve_in(text: &str, group_file: &std::path::Path) -> Result<Self, String> {
        let text = text.trim();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            let gid = text
                .parse()
                .map_err(|_| format!("listen.socket_group: {text:?} is not a group id"))?;
            return Ok(Self {
                written: text.to_owned(),
                gid,
            });
        }
        use std::io::Read;
        let mut groups = String::new();
        std::fs::File::open(group_file)
            .and_then(|f| f.take(MAX_GROUP_FILE).read_to_string(&mut groups))
            .map_err(|e| {
                format!(
                    "listen.socket_group: cannot read {} to look up {text:?} ({e}); give the \
                     numeric group id instead",
                    group_file.display()
                )
            })?;
        groups
            .lines()
            .find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                let gid = fields.nth(1)?.parse().ok()?;
                (name == text).then_some(gid)
            })
            .map(|gid| Self {
                written: text.to_owned(),
                gid,
            })
            .ok_or_else(|| {
                format!(
                    "listen.socket_group: no group {text:?} in {}; give an existing group's name \
                     or numeric id",
                    group_file.display()
                )
            })
    }
}

impl<'de> Deserialize<'de> for SocketGroup {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Environment values arrive as numbers when they look like one.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Text(String),
            Number(u64),
        }
        let text = match Written::deserialize(deserializer)? {
            Written::Text(text) => text,
            Written::Number(n) => n.to_string(),
        };
        Self::resolve(&text).map_err(serde::de::Error::custom)
    }
}

impl Serialize for SocketGroup {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_resolve_and_unknown_names_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("group");
        std::fs::write(&file, "root:x:0:\nwww-data:x:33:\nnogroup:x:65534:\n").expect("write");
        let gid = |text: &str| SocketGroup::resolve_in(text, &file).map(|g| g.gid);
        assert_eq!(gid("www-data"), Ok(33));
        assert_eq!(gid("1234"), Ok(1234));
        assert!(gid("nginx").unwrap_err().contains("no group \"nginx\""));
        assert!(gid("").is_err());
        assert!(gid("99999999999").is_err(), "beyond a gid");
    }
}
