//! The bound every YAML text sluice reads passes before any value is built from it (policy files
//! and directories, hot reload, `config check`, the tenant table, `sluice inject`): what anchors
//! and aliases expand to, and how deep nodes nest.
//!
//! An alias repeats its anchor's node, and anchors may contain aliases: a few kilobytes of nested
//! aliases ("billion laughs") expand to gigabytes once deserialized into values. serde_yaml
//! replays an alias's events without copying them, so walking the document with a visitor that
//! keeps nothing costs no memory; the walk counts every node and scalar byte of the expanded
//! document and stops as soon as the budget is spent, before any real parse builds a value.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Visitor};

/// How much an expanded document may weigh (one per node plus its scalar bytes), relative to the
/// text: `EXPANSION_FACTOR` times its length plus `EXPANSION_SLACK`. A file without aliases
/// weighs less than its length, so only aliases can reach the bound.
pub const EXPANSION_FACTOR: u64 = 16;
/// See [`EXPANSION_FACTOR`].
pub const EXPANSION_SLACK: u64 = 1 << 20;
/// Deepest nesting of collections (a policy file needs 5; an envoyproxy/ratelimit file two per
/// descriptor level, and its conversion takes 8 levels). Below serde_yaml's own recursion limit
/// (128), so that a deep file is refused for its depth, never read as something else.
pub const MAX_DEPTH: usize = 64;

/// The text is refused before it is parsed: what was exceeded, and the line where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpansionError {
    /// The expansion bound (weight units: nodes plus scalar bytes), or 0 for [`MAX_DEPTH`].
    pub bound: u64,
    /// `true`: nested deeper than [`MAX_DEPTH`]; `false`: expands past `bound`.
    pub too_deep: bool,
    /// The line (1-based) where the walk stopped, when known.
    pub line: Option<usize>,
}

impl fmt::Display for ExpansionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.too_deep {
            return write!(
                f,
                "nested deeper than {MAX_DEPTH} levels of lists and mappings; refused (a policy \
                 file needs 5, an envoyproxy/ratelimit file converts at most 8 descriptor levels)"
            );
        }
        write!(
            f,
            "anchors and aliases expand this file past {} nodes and bytes ({}x its size + 1 MiB); \
             refused (write the repeated parts out, or use fewer nested aliases)",
            self.bound, EXPANSION_FACTOR
        )
    }
}

impl std::error::Error for ExpansionError {}

/// Refuses `text` if its YAML documents, with every alias expanded, weigh more than the bound, or
/// nest deeper than [`MAX_DEPTH`]. The walk keeps no value, so it costs no memory. Syntax errors
/// are not reported here: the real parse reports them with their line.
pub fn check_expansion(text: &str) -> Result<(), ExpansionError> {
    let bound = EXPANSION_FACTOR
        .saturating_mul(text.len() as u64)
        .saturating_add(EXPANSION_SLACK);
    let budget = Budget {
        left: Cell::new(bound),
        spent: Cell::new(false),
        depth: Cell::new(0),
        too_deep: Cell::new(false),
    };
    let mut line = None;
    for document in serde_yaml::Deserializer::from_str(text) {
        if let Err(error) = (&budget).deserialize(document) {
            // serde_yaml's own alias bound ("repetition limit exceeded") is the same refusal;
            // a syntax error is the real parse's to report.
            if error.to_string().contains("repetition limit") {
                budget.spent.set(true);
            }
            line = error.location().map(|l| l.line());
            break;
        }
    }
    match (budget.spent.get(), budget.too_deep.get()) {
        (false, false) => Ok(()),
        (_, too_deep) => Err(ExpansionError {
            bound: if too_deep { 0 } else { bound },
            too_deep,
            line,
        }),
    }
}

struct Budget {
    left: Cell<u64>,
    spent: Cell<bool>,
    /// Collections open around the node being walked.
    depth: Cell<usize>,
    too_deep: Cell<bool>,
}

impl Budget {
    /// Walks a collection's children one level deeper.
    fn nested<E: de::Error>(&self, walk: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let depth = self.depth.get() + 1;
        if depth > MAX_DEPTH {
            self.too_deep.set(true);
            return Err(E::custom("nested too deep"));
        }
        self.depth.set(depth);
        let walked = walk();
        self.depth.set(depth - 1);
        walked
    }

    fn spend<E: de::Error>(&self, weight: u64) -> Result<(), E> {
        match self.left.get().checked_sub(weight) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.spent.set(true);
                Err(E::custom("expansion budget spent"))
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for &Budget {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &Budget {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<(), E> {
        self.spend(1 + value.len() as u64)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.spend(1)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.spend(1)?;
        self.nested(|| {
            while seq.next_element_seed(self)?.is_some() {}
            Ok(())
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.spend(1)?;
        self.nested(|| {
            while map.next_key_seed(self)?.is_some() {
                map.next_value_seed(self)?;
            }
            Ok(())
        })
    }

    /// A tagged node (`!tag value`): the tag, then its value.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let ((), variant) = data.variant_seed(self)?;
        de::VariantAccess::newtype_variant_seed(variant, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3.6 KB file whose 2,500 aliases each repeat a 3 KB string: 7.5 MB of text once
    /// expanded, 50 times that as values.
    pub(crate) fn alias_bomb() -> String {
        let mut text = format!("a0: &a0 \"{}\"\n", "lol".repeat(1000));
        text.push_str(&format!("a1: &a1 [{}]\n", vec!["*a0"; 50].join(",")));
        text.push_str(&format!("a2: [{}]\n", vec!["*a1"; 50].join(",")));
        text
    }

    #[test]
    fn an_alias_bomb_is_refused_without_expanding_it() {
        let bomb = alias_bomb();
        assert!(bomb.len() < 4000, "{}", bomb.len());
        let error = check_expansion(&bomb).unwrap_err();
        assert!(error.to_string().contains("anchors and aliases"), "{error}");
        // Nine levels of nine aliases of a short list (billions of nodes): serde_yaml's own
        // bound on alias jumps stops this one first; it is refused the same way.
        let mut laughs = String::from("a0: &a0 [lol, lol, lol, lol, lol]\n");
        for level in 1..10 {
            let items = vec![format!("*a{}", level - 1); 9].join(", ");
            laughs.push_str(&format!("a{level}: &a{level} [{items}]\n"));
        }
        assert!(check_expansion(&laughs).is_err());
    }

    #[test]
    fn ordinary_aliases_and_plain_files_pass() {
        let text = "defaults: &d {limit: 10, period: 1m}\n\
                    policies:\n  - {name: a, <<: *d}\n  - {name: b, <<: *d}\n";
        assert_eq!(check_expansion(text), Ok(()));
        let plain = "policies:\n".to_owned() + &"  - {name: x, limit: 1}\n".repeat(5000);
        assert_eq!(check_expansion(&plain), Ok(()));
        // Bad syntax is the real parser's to report, with its line.
        assert_eq!(check_expansion("policies: [\n"), Ok(()));
        assert_eq!(check_expansion("!tag {a: 1}\n---\n- x\n"), Ok(()));
    }

    #[test]
    fn deep_nesting_is_refused_for_its_depth_with_its_line() {
        let deep = |levels: usize| {
            let mut text = String::from("domain: d\n");
            for level in 0..levels {
                let pad = "    ".repeat(level);
                text.push_str(&format!("{pad}descriptors:\n{pad}  - key: k{level}\n"));
            }
            let pad = "    ".repeat(levels);
            text.push_str(&format!(
                "{pad}rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
            text
        };
        assert_eq!(check_expansion(&deep(10)), Ok(()));
        let error = check_expansion(&deep(40)).unwrap_err();
        assert!(error.too_deep, "{error}");
        assert!(
            error.to_string().contains("nested deeper than 64"),
            "{error}"
        );
        // The 32nd descriptor (line 3 + 2 * 31) opens the 65th collection.
        assert_eq!(error.line, Some(65), "{error}");
        // Flow style, past serde_yaml's own recursion limit: still a depth refusal.
        let flow = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(check_expansion(&flow).unwrap_err().too_deep);
    }

    #[test]
    fn the_bound_counts_expanded_weight() {
        // Just under and just over the bound, with one alias of a large scalar.
        let scalar = "x".repeat(100_000);
        let under = format!("a: &a \"{scalar}\"\nb: [{}]\n", vec!["*a"; 20].join(","));
        assert_eq!(check_expansion(&under), Ok(()));
        let over = format!("a: &a \"{scalar}\"\nb: [{}]\n", vec!["*a"; 40].join(","));
        assert!(check_expansion(&over).is_err());
    }
}
