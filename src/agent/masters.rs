//! The masters an agent knows (`--master A,B,C`, `master_addr`): one leads,
//! the others wait (and do not listen) or are gone. The agent dials one at
//! a time and moves to the next when it cannot be reached, refuses it, or
//! is of an older term than one it has seen; after a whole round without
//! a master it backs off (jittered) before the next round.

use std::net::SocketAddr;

#[derive(Debug, Clone)]
pub struct Masters {
    addrs: Vec<SocketAddr>,
    at: usize,
}

impl Masters {
    /// `HOST:PORT[,HOST:PORT...]`, IP hosts; an error names the bad part.
    pub fn parse(list: &str) -> Result<Masters, String> {
        let addrs = list
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| a.parse::<SocketAddr>().map_err(|_| format!("{a:?} is not HOST:PORT with an IP host")))
            .collect::<Result<Vec<_>, _>>()?;
        if addrs.is_empty() {
            return Err("no master address".into());
        }
        Ok(Masters { addrs, at: 0 })
    }

    pub fn one(addr: SocketAddr) -> Masters {
        Masters { addrs: vec![addr], at: 0 }
    }

    /// The master to dial now.
    pub fn current(&self) -> SocketAddr {
        self.addrs[self.at % self.addrs.len()]
    }

    /// Moves to the next master; true when that starts a new round (every
    /// master was tried since the last one that served).
    pub fn advance(&mut self) -> bool {
        self.at = (self.at + 1) % self.addrs.len();
        self.at == 0
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }
}

impl std::fmt::Display for Masters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        f.write_str(&list.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_parses_and_rounds_come_back_to_the_first() {
        let mut m = Masters::parse("127.0.0.1:1, 127.0.0.2:2,127.0.0.3:3").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m.current().port(), 1);
        assert!(!m.advance());
        assert!(!m.advance());
        assert_eq!(m.current().port(), 3);
        assert!(m.advance());
        assert_eq!(m.current().port(), 1);
        assert!(Masters::parse("127.0.0.1:1,nope").unwrap_err().contains("nope"));
        assert!(Masters::parse(" , ").is_err());
    }
}
