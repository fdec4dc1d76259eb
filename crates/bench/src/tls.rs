//! TLS for `sluice bench compare --tls`: a throwaway certificate authority and a server
//! certificate for 127.0.0.1, as PEM files both brokers read (Sluice's and Kafka's
//! `ssl.keystore.type=PEM`), and the client settings that trust it.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The PEM files of one run.
#[derive(Debug, Clone)]
pub struct BenchTls {
    /// Private key (PKCS#8) and certificate chain of the brokers.
    pub server_pem: PathBuf,
    /// The CA clients trust.
    pub ca_pem: PathBuf,
}

impl BenchTls {
    /// Makes a CA and a server certificate (127.0.0.1, localhost) under `dir`.
    pub fn generate(dir: &Path) -> anyhow::Result<BenchTls> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "sluice-bench-ca");
        let ca = ca_params.self_signed(&ca_key)?;
        let server_key = KeyPair::generate()?;
        let mut server_params = CertificateParams::new(vec!["localhost".to_string()])?;
        server_params.subject_alt_names.push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        server_params.distinguished_name.push(rcgen::DnType::CommonName, "localhost");
        let server = server_params.signed_by(&server_key, &ca, &ca_key)?;
        let tls = BenchTls { server_pem: dir.join("server.pem"), ca_pem: dir.join("ca.pem") };
        std::fs::write(&tls.server_pem, format!("{}{}{}", server_key.serialize_pem(), server.pem(), ca.pem()))?;
        std::fs::write(&tls.ca_pem, ca.pem())?;
        Ok(tls)
    }

    /// What a librdkafka client needs to connect to the brokers' SSL listeners.
    pub fn client_settings(&self) -> Vec<(String, String)> {
        vec![("security.protocol".into(), "SSL".into()), ("ssl.ca.location".into(), self.ca_pem.display().to_string())]
    }
}
