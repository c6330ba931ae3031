#!/usr/bin/env bash
# Self-signed CA + SuperLink server certificate (SANs: superlink, localhost, 127.0.0.1, ::1, plus HETFL_SANS).
# Usage: [HETFL_SANS="IP:10.0.0.5 DNS:server.lan"] docker/certs/generate.sh [OUT_DIR]   (default: docker/certs/out).
# HETFL_SANS adds the addresses devices on other hosts use to reach the SuperLink (docs/deployment.md, "Docker Compose").
# For tests and clusters of your own; use certificates from your own CA in production.
set -euo pipefail
OUT="${1:-$(dirname "$0")/out}"
mkdir -p "$OUT"
cd "$OUT"
[ -f ca.crt ] && [ -f server.pem ] && { echo "certificates exist in $OUT"; exit 0; }
cat > server.conf <<CONF
[req]
distinguished_name = dn
prompt = no
req_extensions = v3_req
[dn]
CN = superlink
[v3_req]
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt
[alt]
DNS.1 = superlink
DNS.2 = localhost
IP.1 = 127.0.0.1
IP.2 = ::1
CONF
n_ip=2 n_dns=2
for san in ${HETFL_SANS:-}; do
  case "$san" in
    IP:*) n_ip=$((n_ip + 1)); echo "IP.$n_ip = ${san#IP:}" >> server.conf;;
    DNS:*) n_dns=$((n_dns + 1)); echo "DNS.$n_dns = ${san#DNS:}" >> server.conf;;
    *) echo "error: HETFL_SANS entry '$san': expected IP:<address> or DNS:<name>" >&2; exit 2;;
  esac
done
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
openssl req -new -x509 -key ca.key -sha256 -subj "/CN=hetfl-ca" -days 365 -out ca.crt
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out server.key
openssl req -new -key server.key -out server.csr -config server.conf
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.pem -days 365 -sha256 \
  -extfile server.conf -extensions v3_req 2>/dev/null
chmod 644 ca.crt server.pem server.key
echo "wrote $OUT/{ca.crt,server.pem,server.key}"
