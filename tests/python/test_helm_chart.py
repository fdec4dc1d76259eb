"""The Helm chart (deploy/helm/sluice): `helm lint` passes, `helm template` renders what a
cluster needs (a StatefulSet started in parallel, a headless Service that publishes
not-ready pods, a client Service, a PodDisruptionBudget, probes on /readyz and /healthz,
the TLS and SASL Secrets mounted and used), and the sluice.toml it renders is one the
broker starts with. Helm comes from scripts/helm.sh (built from the Go module proxy)."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

from conftest import REPO, SLUICE_BIN, free_port

CHART = REPO / "deploy" / "helm" / "sluice"
SECURE = ["--set", "tls.enabled=true,tls.secretName=sluice-tls,tls.clientAuth=required",
          "--set", "sasl.enabled=true,sasl.passwordSecret.name=sluice-admin,authorizer.enabled=true"]


@pytest.fixture(scope="module")
def helm() -> str:
    # Waits on the script's lock while scripts/test.sh's background build runs.
    return subprocess.run(["bash", str(REPO / "scripts" / "helm.sh"), "path"], capture_output=True, text=True,
                          check=True, timeout=1800).stdout.strip()


def render(helm: str, *args: str) -> dict[str, dict]:
    """{kind/name: object} of `helm template`."""
    out = subprocess.run([helm, "template", "r1", str(CHART), "--namespace", "ns", *args], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return {f"{doc['kind']}/{doc['metadata']['name']}": doc for doc in yaml.safe_load_all(out) if doc}


def test_helm_lint_passes_with_and_without_tls_and_sasl(helm):
    for extra in ([], SECURE):
        lint = subprocess.run([helm, "lint", "--strict", str(CHART), *extra], capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_rendered_cluster(helm):
    objects = render(helm, "--set", "replicas=5")
    assert sorted(objects) == ["ConfigMap/r1-sluice", "PodDisruptionBudget/r1-sluice", "Secret/r1-sluice-cluster",
                               "Service/r1-sluice", "Service/r1-sluice-headless", "StatefulSet/r1-sluice"]
    sts = objects["StatefulSet/r1-sluice"]["spec"]
    assert sts["replicas"] == 5 and sts["podManagementPolicy"] == "Parallel"
    assert sts["serviceName"] == "r1-sluice-headless"
    container = sts["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"kafka": 9092, "controller": 9093,
                                                                           "metrics": 9644}
    assert sts["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert sts["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"

    headless = objects["Service/r1-sluice-headless"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    client = objects["Service/r1-sluice"]["spec"]
    assert client.get("clusterIP") != "None" and not client.get("publishNotReadyAddresses")
    pdb = objects["PodDisruptionBudget/r1-sluice"]["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"] == sts["selector"]["matchLabels"]

    config = objects["ConfigMap/r1-sluice"]["data"]["sluice.toml"]
    voters = re.search(r'voters = "([^"]+)"', config).group(1).split(",")
    assert voters == [f"{i + 1}@r1-sluice-{i}.r1-sluice-headless.ns.svc:9093" for i in range(5)]
    assert '"listener.security.protocol.map" = "CLIENT:PLAINTEXT,ADMIN:PLAINTEXT"' in config


def test_tls_and_sasl_secrets_are_mounted_and_used(helm):
    objects = render(helm, *SECURE)
    pod = objects["StatefulSet/r1-sluice"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "sluice-tls"
    assert volumes["sasl"]["secret"]["secretName"] == "sluice-admin"
    assert volumes["cluster-secret"]["secret"]["secretName"] == "r1-sluice-cluster"
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["tls"] == "/etc/sluice/tls" and mounts["sasl"] == "/etc/sluice/sasl"
    # The keystore is the TLS Secret's key and chain in one file, made at start.
    assert "cat /etc/sluice/tls/tls.key /etc/sluice/tls/tls.crt > /run/sluice/keystore.pem" in container["args"][0]
    # The admin user is made from the SASL Secret over the pod's own admin listener.
    post_start = " ".join(container["lifecycle"]["postStart"]["exec"]["command"])
    assert "user -b 127.0.0.1:9095 add admin" in post_start
    assert "--password-file /etc/sluice/sasl/password" in post_start

    config = objects["ConfigMap/r1-sluice"]["data"]["sluice.toml"]
    assert '"listener.security.protocol.map" = "CLIENT:SASL_SSL,ADMIN:PLAINTEXT"' in config
    assert '"ssl.keystore.location" = "/run/sluice/keystore.pem"' in config
    assert '"ssl.truststore.location" = "/etc/sluice/tls/ca.crt"' in config
    assert '"ssl.client.auth" = "required"' in config
    assert '"super.users" = "User:ANONYMOUS;User:admin"' in config

    missing = subprocess.run([helm, "template", "r1", str(CHART), "--set", "tls.enabled=true"],
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "tls.secretName is required with tls.enabled" in missing.stderr


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return answer.status
    except (urllib.error.URLError, OSError):
        return 0


def test_the_rendered_config_is_one_the_broker_starts_with(helm, tmp_path):
    """One replica's sluice.toml, with the pod's paths and DNS name pointed at this machine."""
    kafka, controller, metrics, admin = (free_port() for _ in range(4))
    objects = render(helm, "--set", f"replicas=1,ports.kafka={kafka},ports.controller={controller},"
                     f"ports.metrics={metrics},ports.admin={admin}")
    secret = tmp_path / "cluster.secret"
    secret.write_text("0123456789abcdef0123456789abcdef")
    os.chmod(secret, 0o600)
    config = (objects["ConfigMap/r1-sluice"]["data"]["sluice.toml"]
              .replace("/var/lib/sluice", str(tmp_path / "data"))
              .replace("/etc/sluice/cluster/cluster.secret", str(secret))
              .replace("r1-sluice-0.r1-sluice-headless.ns.svc", "127.0.0.1")
              .replace("0.0.0.0:", "127.0.0.1:"))
    (tmp_path / "sluice.toml").write_text(config)
    proc = subprocess.Popen([SLUICE_BIN, "serve", "--config", str(tmp_path / "sluice.toml"), "--node-id", "1",
                             "--override", f"advertised.listeners=CLIENT://127.0.0.1:{kafka}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while readyz(metrics) != 200:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the broker did not become ready with the chart's config"
            time.sleep(0.1)
        for port in (kafka, admin):
            health = subprocess.run([SLUICE_BIN, "cluster", "health", "--wait", "--timeout", "20s", "-b",
                                     f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
            assert health.returncode == 0 and health.stdout.startswith("healthy: 1 broker unfenced (1)"), \
                health.stdout + health.stderr
    finally:
        proc.kill()
        proc.wait()
