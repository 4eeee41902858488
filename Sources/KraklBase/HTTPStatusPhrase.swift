/// The standard reason phrases of HTTP statuses (RFC 9110 §15, and 428/429 from RFC 6585): the
/// viewer's status lines and the room drivers' words for a refusal whose body says nothing.
/// Ours rather than FoundationNetworking's: importing that module links libcurl and its TLS,
/// Kerberos and LDAP libraries into the agent, several MB of resident memory for one table
/// (docs/PERFORMANCE.md).
public enum HTTPStatusPhrase {
    /// The phrase of a status this table knows; nil for the others (each caller says those its way).
    public static func standard(_ status: Int) -> String? {
        switch status {
        case 200: "OK"
        case 201: "Created"
        case 204: "No Content"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 402: "Payment Required"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 406: "Not Acceptable"
        case 407: "Proxy Authentication Required"
        case 408: "Request Timeout"
        case 409: "Conflict"
        case 410: "Gone"
        case 411: "Length Required"
        case 412: "Precondition Failed"
        case 413: "Content Too Large"
        case 414: "URI Too Long"
        case 415: "Unsupported Media Type"
        case 421: "Misdirected Request"
        case 422: "Unprocessable Content"
        case 428: "Precondition Required"
        case 429: "Too Many Requests"
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 504: "Gateway Timeout"
        case 505: "HTTP Version Not Supported"
        default: nil
        }
    }
}
