#!/bin/sh
# A certificate authority for a traind cluster, and a certificate for each node, with openssl.
#   deploy/make-certs.sh DIR NAME=ADDRESS [NAME=ADDRESS ...]
# DIR/ca.pem and DIR/ca.key are the CA (made on the first run, reused after: run it again to add
# nodes); each NAME gets DIR/NAME.pem, for ADDRESS (an IP address, or a DNS name the others use
# to reach it), and DIR/NAME.key (mode 0600). Then, on each node:
#   /etc/traind/ca.pem              DIR/ca.pem (every node and every client: --tls-ca, --cacert)
#   /etc/traind/NAME.pem, NAME.key  that node's own (--tls-cert, --tls-key)
# Keep DIR/ca.key off the nodes: whoever has it can make a certificate any node trusts.
# Keys are ECDSA P-256; certificates last 825 days (DAYS=N to change it).
set -eu
if [ $# -lt 2 ]; then
    sed -n '2,11s/^# \{0,1\}//p' "$0" >&2
    exit 2
fi
dir=$1
shift
days=${DAYS:-825}
mkdir -p "$dir"
umask 077
if [ ! -f "$dir/ca.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" -subj "/CN=traind cluster CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        2>"$dir/.openssl.err" || { cat "$dir/.openssl.err" >&2; exit 1; }
    chmod 644 "$dir/ca.pem"
    echo "made the CA: $dir/ca.pem (its key $dir/ca.key stays here)"
fi
for node in "$@"; do
    name=${node%%=*} address=${node#*=}
    case $name in "" | *[!A-Za-z0-9._-]*)
        echo "make-certs.sh: \"$node\": expected NAME=ADDRESS, NAME of letters, digits, . _ -" >&2
        exit 2 ;;
    esac
    if [ "$name" = "$node" ] || [ -z "$address" ]; then
        echo "make-certs.sh: \"$node\": expected NAME=ADDRESS (an IP address or a DNS name)" >&2
        exit 2
    fi
    case $address in
    *[!0-9.]*) san="DNS:$address" ;;
    *) san="IP:$address" ;;
    esac
    case $address in *:*) san="IP:$address" ;; esac # IPv6
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
        "$san" >"$dir/$name.ext"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/$name.key" \
        -out "$dir/$name.csr" -subj "/CN=$name" 2>"$dir/.openssl.err" &&
        openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
            -CAcreateserial -days "$days" -out "$dir/$name.pem" -extfile "$dir/$name.ext" \
            2>"$dir/.openssl.err" || { cat "$dir/.openssl.err" >&2; exit 1; }
    rm -f "$dir/$name.csr" "$dir/$name.ext"
    chmod 644 "$dir/$name.pem"
    chmod 600 "$dir/$name.key"
    echo "made $dir/$name.pem for $san (its key $dir/$name.key)"
done
rm -f "$dir/.openssl.err"
