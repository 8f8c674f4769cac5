//! Maps in request bodies with every key once: JSON lets an object repeat
//! a key and serde keeps the last value, so `{"config": {"port": 1,
//! "port": 2}}` would be taken as port 2 silently, whatever the client
//! meant. A map field uses [`keys`] (`deserialize_with`) and a repeated key
//! is refused, naming it. (Struct fields refuse repeats by themselves.)

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};

/// Deserializes a map, refusing a key that appears twice.
pub fn keys<'de, D, V>(d: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: de::Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Unique<V>(PhantomData<V>);

    impl<'de, V: Deserialize<'de>> Visitor<'de> for Unique<V> {
        type Value = BTreeMap<String, V>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object with each key once")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format!(
                        "duplicate key {:?}: each key may appear once",
                        crate::ids::shorten(&key, 64)
                    )));
                }
                let value = map.next_value()?;
                out.insert(key, value);
            }
            Ok(out)
        }
    }

    d.deserialize_map(Unique(PhantomData))
}

/// [`keys`] for an optional map: present (empty included) is `Some`,
/// absent is `None` (with `#[serde(default)]`); `null` is refused.
pub fn keys_option<'de, D, V>(d: D) -> Result<Option<BTreeMap<String, V>>, D::Error>
where
    D: de::Deserializer<'de>,
    V: Deserialize<'de>,
{
    keys(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "keys")]
        config: BTreeMap<String, serde_json::Value>,
    }

    #[test]
    fn a_repeated_key_is_refused_and_single_ones_kept() {
        let ok: Body = serde_json::from_str(r#"{"config": {"a": 1, "b": "x"}}"#).unwrap();
        assert_eq!(ok.config.len(), 2);
        let err = serde_json::from_str::<Body>(r#"{"config": {"a": 1, "a": 2}}"#).unwrap_err();
        assert!(err.to_string().contains("duplicate key \"a\""), "{err}");
        let empty: Body = serde_json::from_str("{}").unwrap();
        assert!(empty.config.is_empty());
    }
}
