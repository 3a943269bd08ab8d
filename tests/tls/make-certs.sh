#!/bin/sh
# Makes a test CA and two server certificates signed by it, in DIR:
#   ca.pem                 the CA certificate (clients trust it)
#   localhost.pem/.key     for localhost and 127.0.0.1
#   other.pem/.key         for other.test and *.other.test
# Used by the unit and integration tests; keys are EC P-256, valid for a day.
#   tests/tls/make-certs.sh DIR
# Always makes new ones: certificates found in DIR may have expired.
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj "/CN=spindle test CA" -keyout ca.key -out ca.pem 2>/dev/null
leaf() {  # leaf NAME SUBJECT_ALT_NAMES
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$2" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
leaf localhost "DNS:localhost,IP:127.0.0.1"
leaf other "DNS:other.test,DNS:*.other.test"
