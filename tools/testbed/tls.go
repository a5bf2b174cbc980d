package testbed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// tlsFiles is a throw-away CA and a server certificate for 127.0.0.1,
// also good as a client certificate (for servers that ask for one), as
// separate PEM files (etcd) and as PEM key and trust stores (ZooKeeper's
// ssl.keyStore.type=PEM: the key in PKCS #8 with the certificate, and the
// CA).
type tlsFiles struct {
	cert, key            string
	keyStore, trustStore string
	pool                 *x509.CertPool
	pair                 tls.Certificate
}

func makeTLS(dir string) (*tlsFiles, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("testbed: tls: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "oproute test bed CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("testbed: tls: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("testbed: tls: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("testbed: tls: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("testbed: tls: %w", err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("testbed: tls: %w", err)
	}
	f := &tlsFiles{cert: filepath.Join(dir, "server.crt"), key: filepath.Join(dir, "server.key"),
		keyStore: filepath.Join(dir, "keystore.pem"), trustStore: filepath.Join(dir, "truststore.pem"), pool: x509.NewCertPool()}
	f.pool.AddCert(ca)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	for _, file := range []struct {
		path string
		data []byte
	}{
		{f.cert, certPEM},
		{f.key, keyPEM},
		{f.keyStore, append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), certPEM...)},
		{f.trustStore, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})},
	} {
		if err := os.WriteFile(file.path, file.data, 0o600); err != nil {
			return nil, fmt.Errorf("testbed: tls: %w", err)
		}
	}
	if f.pair, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("testbed: tls: %w", err)
	}
	return f, nil
}

// ClientTLS returns a TLS configuration that trusts the cluster's CA, nil
// when the cluster was started without EtcdOptions.ClientTLS.
func (c *EtcdCluster) ClientTLS() *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls.clientConfig()
}

// clientConfig trusts the CA and presents the certificate to servers that
// ask for a client's.
func (f *tlsFiles) clientConfig() *tls.Config {
	return &tls.Config{RootCAs: f.pool, Certificates: []tls.Certificate{f.pair}, MinVersion: tls.VersionTLS12}
}

// ClientTLS returns a TLS configuration that trusts the ensemble's CA and
// presents a client certificate, nil when the ensemble was started without
// ZKOptions.ClientTLS.
func (c *ZKCluster) ClientTLS() *tls.Config {
	if c.tls == nil {
		return nil
	}
	return c.tls.clientConfig()
}
