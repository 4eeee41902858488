// OpenSSL 3.0 (Debian libssl-dev): DTLS 1.2, certificates, HMAC-SHA1 and CRC for STUN.
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/bio.h>
