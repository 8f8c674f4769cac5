//! The join token an agent enrolls with: `flj_<id>_<secret>_<ca>`.
//!
//! `id` (12 hex digits) names the token in lists and revocations; `secret`
//! (32 hex digits) is checked against the SHA-256 the master keeps; `ca`
//! (64 hex digits) is the SHA-256 of the master's CA certificate, which the
//! agent pins before it sends anything (see [`super::pin`]).

use super::Fingerprint;

pub const PREFIX: &str = "flj_";
pub const ID_BYTES: usize = 6;
pub const SECRET_BYTES: usize = 16;

#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: String,
    pub ca: Fingerprint,
}

/// Never prints the secret.
impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken").field("id", &self.id).finish_non_exhaustive()
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}{}_{}_{}", self.id, self.secret, hex::encode(self.ca))
    }
}

fn hex_of(s: &str, bytes: usize) -> bool {
    s.len() == bytes * 2 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl std::str::FromStr for JoinToken {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "not a join token: expected {PREFIX}<12 hex>_<32 hex>_<64 hex>, as `flotilla node token create` prints"
            )
        };
        let rest = s.trim().strip_prefix(PREFIX).ok_or_else(bad)?;
        let mut parts = rest.split('_');
        let (Some(id), Some(secret), Some(ca), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        if !(hex_of(id, ID_BYTES) && hex_of(secret, SECRET_BYTES) && hex_of(ca, 32)) {
            return Err(bad());
        }
        let mut pin = [0u8; 32];
        hex::decode_to_slice(ca, &mut pin).map_err(|_| bad())?;
        Ok(JoinToken { id: id.into(), secret: secret.into(), ca: pin })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_anything_else() {
        let t = JoinToken { id: "0123456789ab".into(), secret: "00112233445566778899aabbccddeeff".into(), ca: [7; 32] };
        let s = t.to_string();
        assert_eq!(s.parse::<JoinToken>().unwrap(), t);
        assert!(!format!("{t:?}").contains(&t.secret), "Debug leaks the secret");
        for bad in [
            "",
            "flt_0123456789ab_00112233445566778899aabbccddeeff",
            &s[..s.len() - 1],
            &format!("{s}_00"),
            &s.replace("flj_01", "flj_0G"),
            &s.to_uppercase(),
        ] {
            assert!(bad.parse::<JoinToken>().is_err(), "{bad:?} accepted");
        }
    }
}
