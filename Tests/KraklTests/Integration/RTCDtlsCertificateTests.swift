import Foundation
import KraklRTC
import Testing

/// Our per-session certificate as OpenSSL's command line reads it.
@Suite(.tags(.integration))
struct RTCDtlsCertificateTests {
    @Test func opensslReadsOurCertificateAsSelfSignedP256() throws {
        let certificate = try Certificate()
        let folder = try Harness.temporaryDirectory()
        let path = folder + "/ours.pem"
        try certificate.pem.write(toFile: path, atomically: true, encoding: .utf8)
        // openssl computes the fingerprint itself; ours must be the same bytes and form.
        #expect(try DtlsTestPeerIdentity.opensslFingerprint(of: path) == certificate.fingerprint)
        let text = try Harness.run("/usr/bin/openssl", ["x509", "-in", path, "-noout", "-text"], timeout: 30)
        #expect(text.status == 0)
        #expect(text.stdout.contains("prime256v1") || text.stdout.contains("P-256"), "not a P-256 key")
        #expect(text.stdout.contains("ecdsa-with-SHA256"), "not signed with ECDSA/SHA-256")
        #expect(text.stdout.contains("Subject: CN = \(certificate.commonName)"), "subject CN differs")
        #expect(text.stdout.contains("Issuer: CN = \(certificate.commonName)"), "not self-issued")
        // Self-signed: it verifies against itself.
        let verify = try Harness.run("/usr/bin/openssl", ["verify", "-CAfile", path, path], timeout: 30)
        #expect(verify.stdout.contains("OK"), "openssl verify rejected the self-signature")
        // Valid now and for about 30 days (checkend: still valid N seconds from now).
        let in29Days = try Harness.run("/usr/bin/openssl", ["x509", "-in", path, "-noout", "-checkend", "\(29 * 86_400)"], timeout: 30)
        let in31Days = try Harness.run("/usr/bin/openssl", ["x509", "-in", path, "-noout", "-checkend", "\(31 * 86_400)"], timeout: 30)
        #expect(in29Days.status == 0, "expires within 29 days")
        #expect(in31Days.status != 0, "still valid after 31 days")
    }

    @Test func everySessionGetsItsOwnKeySerialAndName() throws {
        let first = try Certificate(), second = try Certificate()
        #expect(first.fingerprint != second.fingerprint)
        #expect(first.commonName != second.commonName)
        #expect(first.fingerprint.bytes.count == 32)
    }

    @Test func fingerprintSdpFormRoundTrips() throws {
        let fingerprint = try Certificate().fingerprint
        let value = fingerprint.sdpValue
        #expect(value.hasPrefix("sha-256 "))
        let hex = value.dropFirst("sha-256 ".count)
        #expect(hex.count == 32 * 3 - 1, "32 bytes as XX:XX:…")
        #expect(hex == hex.uppercased(), "hex must be upper case")
        #expect(CertificateFingerprint(sdp: value) == fingerprint)
        #expect(CertificateFingerprint(sdp: value.lowercased().replacingOccurrences(of: "sha-256", with: "SHA-256")) == fingerprint)
        for bad in ["", "sha-256", "sha-256 ZZ:00", "sha-256 0:11", "sha-256 AB::CD", "sha-256 AB CD"] {
            #expect(CertificateFingerprint(sdp: bad) == nil, "accepted a malformed fingerprint")
        }
        #expect(fingerprint.short.contains("…"))
    }
}
