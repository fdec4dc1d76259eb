//! TLS for SSL and SASL_SSL listeners (rustls, ring provider), configured with Kafka's
//! `ssl.*` names and PEM files: `ssl.keystore.location` holds the private key and the
//! certificate chain, `ssl.truststore.location` the CAs that client certificates must
//! chain to, `ssl.client.auth` = none | requested | required (mutual TLS).
//!
//! Only PEM stores are read; JKS and PKCS12 stores and encrypted keys are refused at
//! startup with a message that says so, never ignored.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::listeners::Listener;
use crate::settings::TlsSettings;

/// A client that has not finished the TLS handshake by then is disconnected.
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientAuth {
    None,
    Requested,
    Required,
}

fn pem_source(
    config_key: &str,
    location: &Option<std::path::PathBuf>,
    inline: &Option<String>,
) -> Result<Option<Vec<u8>>, String> {
    match (location, inline) {
        (Some(_), Some(_)) => Err(format!("set either {config_key}.location or its inline PEM, not both")),
        (Some(path), None) => {
            std::fs::read(path).map(Some).map_err(|error| format!("{config_key}.location {}: {error}", path.display()))
        }
        (None, Some(text)) => Ok(Some(text.as_bytes().to_vec())),
        (None, None) => Ok(None),
    }
}

fn certificates(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|error| format!("{what}: bad PEM certificate: {error}"))?;
    if certificates.is_empty() {
        return Err(format!("{what} holds no certificate (-----BEGIN CERTIFICATE-----)"));
    }
    Ok(certificates)
}

/// The name of a client that presented a certificate, as Kafka's default
/// `ssl.principal.mapping.rules` gives it: the subject's distinguished name in RFC 2253
/// form (`CN=client,OU=team,O=org`), most specific part first.
pub fn certificate_user(certificate: &CertificateDer<'_>) -> Option<String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, parsed) = X509Certificate::from_der(certificate.as_ref()).ok()?;
    let mut parts = Vec::new();
    for rdn in parsed.subject().iter().collect::<Vec<_>>().into_iter().rev() {
        let attributes: Vec<String> = rdn
            .iter()
            .map(|attribute| {
                let oid = attribute.attr_type();
                let name = x509_parser::objects::oid2abbrev(oid, x509_parser::objects::oid_registry())
                    .map(str::to_string)
                    .unwrap_or_else(|_| oid.to_id_string());
                let value = attribute.as_str().map(rfc2253_escape).unwrap_or_default();
                format!("{name}={value}")
            })
            .collect();
        parts.push(attributes.join("+"));
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

fn rfc2253_escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for (index, c) in value.chars().enumerate() {
        let leading = index == 0 && (c == ' ' || c == '#');
        let trailing = index + 1 == value.chars().count() && c == ' ';
        if leading || trailing || matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Refuses store types and key encryption that Sluice does not read.
fn check_supported(settings: &TlsSettings) -> Result<(), String> {
    for (key, value) in
        [("ssl.keystore.type", &settings.keystore_type), ("ssl.truststore.type", &settings.truststore_type)]
    {
        if !value.eq_ignore_ascii_case("PEM") {
            return Err(format!("{key} {value:?} is not supported; Sluice reads PEM files (set {key} = \"PEM\")"));
        }
    }
    if settings.key_password.is_some() {
        return Err("ssl.key.password: encrypted private keys are not supported; give an unencrypted PEM key".into());
    }
    Ok(())
}

/// This node's certificate chain and private key (`ssl.keystore.*`).
fn keystore(settings: &TlsSettings) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let (chain, key) = match (&settings.keystore_certificate_chain, &settings.keystore_key) {
        (Some(chain), Some(key)) if settings.keystore_location.is_none() => {
            (chain.as_bytes().to_vec(), key.as_bytes().to_vec())
        }
        (None, None) => {
            let pem = pem_source("ssl.keystore", &settings.keystore_location, &None)?
                .ok_or("a listener uses TLS but ssl.keystore.location is not set")?;
            (pem.clone(), pem)
        }
        _ => {
            return Err("set ssl.keystore.location, or both ssl.keystore.certificate.chain and ssl.keystore.key".into())
        }
    };
    let chain = certificates("ssl.keystore", &chain)?;
    let key = PrivateKeyDer::from_pem_slice(&key)
        .map_err(|error| format!("ssl.keystore: no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {error}"))?;
    Ok((chain, key))
}

/// The CAs of `ssl.truststore.*`, or `None` when none is configured.
fn truststore(settings: &TlsSettings) -> Result<Option<rustls::RootCertStore>, String> {
    let Some(pem) = pem_source("ssl.truststore", &settings.truststore_location, &settings.truststore_certificates)?
    else {
        return Ok(None);
    };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates("ssl.truststore", &pem)? {
        roots.add(certificate).map_err(|error| format!("ssl.truststore: {error}"))?;
    }
    Ok(Some(roots))
}

/// The acceptor for TLS listeners, or `None` when no listener uses TLS.
pub fn acceptor(listeners: &[Listener], settings: &TlsSettings) -> Result<Option<TlsAcceptor>, String> {
    if !listeners.iter().any(|listener| listener.protocol.uses_tls()) {
        return Ok(None);
    }
    server_acceptor(settings).map(Some)
}

/// The server side of TLS from `ssl.keystore.*` (and `ssl.client.auth` with
/// `ssl.truststore.*`): what the TLS listeners and the HTTPS services accept with.
pub fn server_acceptor(settings: &TlsSettings) -> Result<TlsAcceptor, String> {
    check_supported(settings)?;
    let client_auth = match settings.client_auth.to_ascii_lowercase().as_str() {
        "none" => ClientAuth::None,
        "requested" => ClientAuth::Requested,
        "required" => ClientAuth::Required,
        other => return Err(format!("ssl.client.auth {other:?} must be none, requested or required")),
    };
    let (chain, key) = keystore(settings)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS setup: {error}"))?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Requested | ClientAuth::Required => {
            let roots = truststore(settings)?
                .ok_or("ssl.client.auth needs ssl.truststore.location (the CAs of client certificates)")?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier =
                if client_auth == ClientAuth::Requested { verifier.allow_unauthenticated() } else { verifier };
            builder.with_client_cert_verifier(verifier.build().map_err(|error| format!("ssl.truststore: {error}"))?)
        }
    };
    let server = builder
        .with_single_cert(chain, key)
        .map_err(|error| format!("ssl.keystore: the key does not fit the certificate: {error}"))?;
    Ok(TlsAcceptor::from(Arc::new(server)))
}

/// The connector this node uses to reach other nodes' TLS inter-broker listener: it
/// trusts the CAs of `ssl.truststore.*`, checks the peer's name against its certificate
/// (Kafka's default `ssl.endpoint.identification.algorithm=https`) and shows this node's
/// own certificate, so peers that require client certificates accept it.
pub fn connector(settings: &TlsSettings) -> Result<TlsConnector, String> {
    check_supported(settings)?;
    let roots = truststore(settings)?
        .ok_or("TLS between nodes needs ssl.truststore.location (the CA that signed the brokers' certificates)")?;
    let (chain, key) = keystore(settings)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS setup: {error}"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|error| format!("ssl.keystore: the key does not fit the certificate: {error}"))?;
    Ok(TlsConnector::from(Arc::new(client)))
}

/// TLS for controller RPC (`[cluster] rpc_tls`): this node's certificate for the server
/// side, the truststore's CAs for the client side. Peers are authenticated by the shared
/// secret, so no client certificate is asked for.
pub fn rpc_tls(settings: &TlsSettings) -> Result<sluice_cluster::RpcTls, String> {
    check_supported(settings)?;
    let (chain, key) = keystore(settings)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS setup: {error}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| format!("ssl.keystore: the key does not fit the certificate: {error}"))?;
    // Connections are pooled and probed for a close while idle: nothing may arrive unasked.
    server.send_tls13_tickets = 0;
    Ok(sluice_cluster::RpcTls { acceptor: TlsAcceptor::from(Arc::new(server)), connector: connector(settings)? })
}
