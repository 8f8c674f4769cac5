//! Serde helpers for time values in stored records.
//!
//! `time::serde::rfc3339::option` deserializes through `deserialize_any`,
//! which bincode (not self-describing) cannot support: an
//! `Option<OffsetDateTime>` field using it encodes fine but never decodes.
//! [`rfc3339_option`] is a drop-in replacement with the same JSON form (an
//! RFC 3339 string or null) that only asks for an option of a string:
//! `#[serde(with = "crate::storage::serde_time::rfc3339_option")]`.

/// A `Duration` written as text like "5s" or "1m 30s" (settings files):
/// `#[serde(with = "crate::storage::serde_time::duration_text")]`.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s)
            .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration like \"5s\": {e}")))
    }
}

/// `Option<OffsetDateTime>` as an optional RFC 3339 string.
pub mod rfc3339_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    pub fn serialize<S: Serializer>(value: &Option<OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
        value.map(|t| t.format(&Rfc3339)).transpose().map_err(serde::ser::Error::custom)?.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OffsetDateTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| OffsetDateTime::parse(&s, &Rfc3339).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use time::OffsetDateTime;

    use crate::storage::codec;
    use crate::storage::testdata::T0;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Ours {
        #[serde(with = "super::rfc3339_option")]
        at: Option<OffsetDateTime>,
        after: u8,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Times {
        #[serde(with = "time::serde::rfc3339::option")]
        at: Option<OffsetDateTime>,
        after: u8,
    }

    #[test]
    fn round_trips_through_the_codec() {
        for at in [Some(T0), None] {
            let v = Ours { at, after: 7 };
            assert_eq!(codec::decode::<Ours>(&codec::encode(&v).unwrap()).unwrap(), v);
        }
    }

    #[test]
    fn the_time_crate_helper_cannot_be_decoded_by_bincode() {
        // Why this module exists; if `time` ever fixes it, this fails and the
        // helper can go.
        let bytes = codec::encode(&Times { at: Some(T0), after: 7 }).unwrap();
        assert!(codec::decode::<Times>(&bytes).is_err());
    }

    #[test]
    fn json_form_matches_the_time_crate_helper() {
        for at in [Some(T0), None] {
            let ours = serde_json::to_string(&Ours { at, after: 1 }).unwrap();
            let theirs = serde_json::to_string(&Times { at, after: 1 }).unwrap();
            assert_eq!(ours, theirs);
            assert_eq!(serde_json::from_str::<Ours>(&theirs).unwrap(), Ours { at, after: 1 });
        }
    }
}
