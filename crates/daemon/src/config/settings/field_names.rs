//! The keys a settings struct takes, read from its `Deserialize` impl (the list serde's derive
//! hands `deserialize_struct`, the same one `deny_unknown_fields` checks), so that no hand-kept
//! list can drift from the struct.

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The field names `T` deserializes (`#[serde(skip)]` fields are not among them); empty if `T`
/// is not a struct.
pub fn of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    // The deserializer stops at `deserialize_struct`, so this always fails once it has the list.
    let _ = T::deserialize(Introspect(&mut fields));
    fields
}

/// A deserializer that records the fields of the struct asked for, then gives up.
struct Introspect<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for Introspect<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}
