//! TLS for client connections: the CAs of `ssl.ca.location` (else the system's), an
//! optional client certificate, or (`enable.ssl.certificate.verification=false`) any
//! certificate, as librdkafka does.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

use crate::settings::Settings;

pub(crate) fn tls_config(settings: &Settings) -> anyhow::Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| anyhow!("TLS setup: {error}"))?;
    let builder = if settings.verify_certificate == Some(false) {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
    } else {
        builder.with_root_certificates(trusted_roots(settings.ca_location.as_ref())?)
    };
    match (&settings.certificate_location, &settings.key_location) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(certificate), Some(key)) => {
            let chain = read_certificates("ssl.certificate.location", certificate)?;
            let key = std::fs::read(key).map_err(|error| anyhow!("ssl.key.location {}: {error}", key.display()))?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|error| anyhow!("ssl.key.location: no unencrypted PEM private key: {error}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| anyhow!("ssl.key.location does not fit ssl.certificate.location: {error}"))
        }
        _ => bail!("a client certificate needs both ssl.certificate.location and ssl.key.location"),
    }
}

/// The CAs of `ssl.ca.location`, else the system's (as librdkafka does).
fn trusted_roots(ca_location: Option<&PathBuf>) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    let Some(path) = ca_location else {
        let native = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(native.certs);
        if added == 0 {
            bail!("no system CA certificates found: give -X ssl.ca.location=CA.pem");
        }
        return Ok(roots);
    };
    for certificate in read_certificates("ssl.ca.location", path)? {
        roots.add(certificate).map_err(|error| anyhow!("ssl.ca.location {}: {error}", path.display()))?;
    }
    Ok(roots)
}

fn read_certificates(key: &str, path: &PathBuf) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).map_err(|error| anyhow!("{key} {}: {error}", path.display()))?;
    let certificates: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|error| anyhow!("{key} {}: bad PEM certificate: {error}", path.display()))?;
    if certificates.is_empty() {
        bail!("{key} {} holds no PEM certificate", path.display());
    }
    Ok(certificates)
}

/// `enable.ssl.certificate.verification=false`: any certificate is taken, as librdkafka
/// does then (the handshake's signatures are still checked, so the link stays encrypted to
/// whoever holds the key of the certificate shown).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            certificate,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            certificate,
            signature,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
