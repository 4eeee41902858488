// OpenSSL 3.0 (Debian libssl-dev): DTLS 1.2, certificates, HMAC-SHA1 and CRC for STUN.
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/bio.h>

// DTLS-SRTP (Sources/KraklRTC/Dtls*.swift): these OpenSSL calls are macros
// over SSL_ctrl/BIO_ctrl, which Swift cannot import; static inline wrappers can be.
#include <openssl/srtp.h>
#include <openssl/x509v3.h>

static inline long krakl_ssl_ctx_set_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }
static inline int krakl_ssl_ctx_set_dtls12_only(SSL_CTX *ctx) {
    return SSL_CTX_set_min_proto_version(ctx, DTLS1_2_VERSION) && SSL_CTX_set_max_proto_version(ctx, DTLS1_2_VERSION);
}
static inline uint64_t krakl_ssl_op_no_query_mtu(void) { return SSL_OP_NO_QUERY_MTU; }
static inline uint64_t krakl_ssl_op_no_renegotiation(void) { return SSL_OP_NO_RENEGOTIATION; }
static inline long krakl_ssl_set_mtu(SSL *ssl, long mtu) { return SSL_set_mtu(ssl, mtu); }
static inline long krakl_dtls_set_link_mtu(SSL *ssl, long mtu) { return DTLS_set_link_mtu(ssl, mtu); }
static inline long krakl_dtls_get_timeout(SSL *ssl, struct timeval *tv) { return DTLSv1_get_timeout(ssl, tv); }
static inline long krakl_dtls_handle_timeout(SSL *ssl) { return DTLSv1_handle_timeout(ssl); }
static inline long krakl_bio_set_mem_eof_return(BIO *bio, long value) { return BIO_set_mem_eof_return(bio, value); }
static inline int krakl_mbstring_asc(void) { return MBSTRING_ASC; }

// HTTPS for the room drivers (Sources/KraklRoom/HTTPConnection.swift): SNI is a macro over SSL_ctrl.
static inline long krakl_ssl_set_tlsext_host_name(SSL *ssl, const char *name) { return SSL_set_tlsext_host_name(ssl, name); }
static inline int krakl_ssl_ctx_set_min_tls12(SSL_CTX *ctx) { return SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION); }
