"""Certificates for the TLS tests, made with the openssl command line in a
temporary directory: CAs, server certificates for 127.0.0.1/localhost and
client certificates (P-256 keys: quick to make)."""
import os
import subprocess


def _run(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_ca(d, name):
    """d/name.key, d/name.pem: a self-signed CA."""
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", name + ".key", "-out", name + ".pem", "-days", "2",
         "-subj", "/CN=" + name, cwd=d)
    return os.path.join(d, name + ".pem")


def make_cert(d, name, ca, cn, server):
    """d/name.key, d/name.pem signed by CA `ca` (made by make_ca)."""
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        if server:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                    "extendedKeyUsage=serverAuth\n")
        else:
            f.write("extendedKeyUsage=clientAuth\n")
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn, cwd=d)
    _run("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
         "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", ext, cwd=d)
    return os.path.join(d, name + ".pem"), os.path.join(d, name + ".key")


def read(path):
    with open(path, "rb") as f:
        return f.read()
