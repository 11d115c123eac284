#!/bin/sh
# Makes the mTLS test fixtures (run once; the output is committed): a test
# CA, a receiver certificate for 127.0.0.1 signed by it, a client
# certificate signed by it, and a self-signed client certificate no CA
# signed ("other"). P-256 keys, valid for 100 years. They guard nothing.
set -eu
cd "$(dirname "$0")"
days=36500
ec() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
ec ca.key
openssl req -x509 -new -key ca.key -days $days -subj "/CN=control-plane mTLS test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" -out ca.pem
ec server.key
openssl req -new -key server.key -subj "/CN=control-plane mTLS test receiver" -out server.csr
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days $days -extfile server.ext -out server.pem
ec client.key
openssl req -new -key client.key -subj "/CN=control-plane mTLS test client/O=tenant a" -out client.csr
printf 'basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -set_serial 3 -days $days -extfile client.ext -out client.pem
ec other.key
openssl req -x509 -new -key other.key -days $days -subj "/CN=control-plane mTLS other client" \
  -addext "extendedKeyUsage=clientAuth" -out other.pem
rm -f ca.key server.csr server.ext client.csr client.ext
