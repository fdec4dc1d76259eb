//! `sluice bench kafka`: an Apache Kafka started the way the bench starts its peer, left
//! running for another program, so that tests and operators can put Sluice and Kafka side by
//! side (the same requests to both, the answers compared) without installing Kafka by hand.
//!
//! It prints one line `ready <bootstrap>` once the broker serves, and stops the broker when
//! its standard input closes (the caller ended or closed the pipe) or when it is signalled
//! (the broker is started with a parent-death signal, so a `kill -9` of this process stops
//! it too).

use std::io::{Read, Write};

use crate::KafkaArgs;

/// Arguments of `sluice bench kafka`.
#[derive(Debug, clap::Args)]
pub struct PeerArgs {
    /// Where and which Kafka to run (one node, KRaft combined mode, on loopback).
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// Starts Kafka, prints `ready <bootstrap>`, and serves until standard input closes.
pub fn run(args: PeerArgs) -> anyhow::Result<()> {
    let brokers = args.kafka.start(1, None, None)?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready {}", brokers.bootstrap())?;
    stdout.flush()?;
    let mut sink = Vec::new();
    // Returns at end of input; the broker set stops its nodes when dropped.
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(brokers);
    Ok(())
}
