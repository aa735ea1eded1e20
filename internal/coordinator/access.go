package coordinator

import (
	"context"
	"fmt"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quota-lease/quota-lease/internal/caller"
	pb "github.com/quota-lease/quota-lease/proto/quotalease/v1"
)

// Authorize is a unary interceptor enforcing methodAccess with the
// identity in the caller's client certificate (Config.TrustDomain). It
// refuses before the handler runs, so a refused call leaves no trace in
// the ledger. Without a trust domain it lets every call through: the
// listener is then plaintext on loopback (see the serve command).
func (c *Coordinator) Authorize(
	ctx context.Context,
	req any,
	info *grpc.UnaryServerInfo,
	handler grpc.UnaryHandler,
) (any, error) {
	if c.cfg.TrustDomain == "" {
		return handler(ctx, req)
	}
	if err := c.authorize(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (c *Coordinator) authorize(ctx context.Context, method string, req any) error {
	id, err := caller.FromContext(ctx, c.cfg.TrustDomain)
	return c.allow(method, req, id, err)
}

// AuthorizeHTTP wraps h so that only callers the gRPC method of the same
// name admits reach it: the console is read under the rule of the admin
// read API (ListLeases). The identity comes from the request's verified
// client certificate; a refusal is 401 (no identity) or 403 (not
// allowed), counted and logged like a refused gRPC call. Without a trust
// domain every request passes, as with Authorize.
func (c *Coordinator) AuthorizeHTTP(method string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.TrustDomain != "" {
			id, err := caller.FromTLS(r.TLS, c.cfg.TrustDomain)
			if err := c.allow(method, nil, id, err); err != nil {
				code := http.StatusForbidden
				if status.Code(err) == codes.Unauthenticated {
					code = http.StatusUnauthorized
				}
				http.Error(w, status.Convert(err).Message(), code)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// refuse counts a call of method refused for reason, logs it at most once
// a second per method and reason (a flood of forged calls must not flood
// the log), and returns err, the refusal to answer with.
func (c *Coordinator) refuse(method, reason string, err error) error {
	if c.refused.add(method, reason) {
		c.log.Warn("call refused (logged at most once a second per method and reason; all are counted)",
			"method", method, "reason", reason, "detail", status.Convert(err).Message())
	}
	return err
}

// allow applies methodAccess to the caller id (idErr: why it has none)
// calling method with req.
func (c *Coordinator) allow(method string, req any, id caller.ID, idErr error) error {
	refuse := func(code codes.Code, reason, msg string, args ...any) error {
		return c.refuse(method, reason, status.Error(code, fmt.Sprintf(msg, args...)))
	}
	if err := idErr; err != nil {
		return refuse(codes.Unauthenticated, "no-identity", "%v", err)
	}
	switch methodAccess[method] {
	case regionAccess:
		lr, ok := req.(*pb.LeaseRequest)
		if !ok || id.Kind != caller.Region {
			return refuse(codes.PermissionDenied, "not-a-region", "%s may not lease: only a region's agents may", id)
		}
		if lr.GetRegion() != id.Name {
			return refuse(codes.PermissionDenied, "other-region",
				"a certificate of region %q may lease only for %q, not for %q", id.Name, id.Name, lr.GetRegion())
		}
		if id.Instance != "" && lr.GetInstance() != id.Instance {
			return refuse(codes.PermissionDenied, "other-instance",
				"a certificate of instance %q may lease only as %q, not as %q", id.Instance, id.Instance, lr.GetInstance())
		}
		if !c.leaseCalls.allow(id.Name) {
			return refuse(codes.ResourceExhausted, "lease-rate",
				"region %q sent more than %v lease calls a second; its agents renew far less often, so something is "+
					"looping or flooding", id.Name, c.cfg.LeaseCallRate)
		}
	case policyAccess:
		if id == caller.CoordinatorID {
			return refuse(codes.PermissionDenied, "server-identity",
				"%s is the coordinators' server identity and calls nothing: give the client a region's, an admin's or "+
					"a viewer's certificate", id)
		}
	case readAccess:
		if id.Kind != caller.Role || id == caller.CoordinatorID {
			return refuse(codes.PermissionDenied, "not-a-role",
				"%s may not use the admin API: it needs role viewer or admin", id)
		}
	case writeAccess:
		if id != (caller.ID{Kind: caller.Role, Name: caller.Admin}) {
			return refuse(codes.PermissionDenied, "not-admin", "%s may not change state: it needs role admin", id)
		}
	default:
		return refuse(codes.PermissionDenied, "unknown-method", "method %s is not served", method)
	}
	return nil
}
