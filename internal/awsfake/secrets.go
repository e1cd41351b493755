package awsfake

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Systems Manager Parameter Store and Secrets Manager, as far as a member
// reads its group's secret from them: GetParameter, ListSecretVersionIds
// and GetSecretValue, over the AWS JSON 1.1 protocol that the real SDK
// clients speak (a POST of a JSON body, the operation in X-Amz-Target;
// errors as a JSON body whose __type is the error code). Tests write
// parameters and secret versions, move Secrets Manager's staging labels as
// a rotation does, and deny the caller's role access to some of them.

// secretState is the model of both services.
type secretState struct {
	params  map[string]*parameter
	secrets map[string]*secret
	denied  map[string]bool // "ssm:NAME" or "secretsmanager:NAME": AccessDeniedException
	reads   []string        // "ssm:NAME" or "secretsmanager:NAME#VERSION", in order
}

type parameter struct {
	value   string
	secure  bool
	version int64
}

type secret struct {
	versions []*secretVersion // in creation order
}

type secretVersion struct {
	id      string
	value   string
	stages  []string
	created time.Time
}

const (
	ssmTarget = "AmazonSSM."
	smTarget  = "secretsmanager."
	jsonType  = "application/x-amz-json-1.1"
)

func (f *Server) secretModel() *secretState {
	if f.sec.params == nil {
		f.sec.params = map[string]*parameter{}
		f.sec.secrets = map[string]*secret{}
		f.sec.denied = map[string]bool{}
	}
	return &f.sec
}

// PutParameter writes a parameter's value, as `aws ssm put-parameter
// --overwrite` does; secure makes it a SecureString, which reads return in
// clear only with WithDecryption.
func (f *Server) PutParameter(name, value string, secure bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.secretModel()
	p := m.params[name]
	if p == nil {
		p = &parameter{}
		m.params[name] = p
	}
	p.value, p.secure = value, secure
	p.version++
}

// PutSecretValue adds a version to a secret (creating the secret) with the
// given staging labels, as `aws secretsmanager put-secret-value
// --version-stages` does: a label moves from the version that had it, and
// when AWSCURRENT moves, AWSPREVIOUS goes to the version that had it. It
// returns the new version's ID.
func (f *Server) PutSecretValue(name, value string, stages ...string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.secretModel()
	s := m.secrets[name]
	if s == nil {
		s = &secret{}
		m.secrets[name] = s
	}
	if len(stages) == 0 {
		stages = []string{"AWSCURRENT"}
	}
	v := &secretVersion{id: fmt.Sprintf("v%02d-%d", len(s.versions)+1, time.Now().UnixNano()), value: value, created: time.Now()}
	s.versions = append(s.versions, v)
	for _, st := range stages {
		s.moveStage(st, v)
	}
	return v.id
}

// UpdateSecretVersionStage moves stage to the version toID, or, with toID
// "", removes it from whichever version has it, as `aws secretsmanager
// update-secret-version-stage` does (AWSPREVIOUS follows a move of
// AWSCURRENT).
func (f *Server) UpdateSecretVersionStage(name, stage, toID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.secretModel().secrets[name]
	if s == nil {
		panic("awsfake: no secret " + name)
	}
	var to *secretVersion
	for _, v := range s.versions {
		if v.id == toID {
			to = v
		}
	}
	if toID != "" && to == nil {
		panic("awsfake: secret " + name + " has no version " + toID)
	}
	s.moveStage(stage, to)
}

// moveStage gives stage to v alone (to none when v is nil).
func (s *secret) moveStage(stage string, v *secretVersion) {
	var had *secretVersion
	for _, o := range s.versions {
		if i := slices.Index(o.stages, stage); i >= 0 {
			had = o
			o.stages = slices.Delete(o.stages, i, i+1)
		}
	}
	if v != nil {
		v.stages = append(v.stages, stage)
	}
	if stage == "AWSCURRENT" && had != nil && had != v {
		s.moveStage("AWSPREVIOUS", had)
	}
}

// DenySecret makes reads of a parameter ("ssm:NAME") or a secret
// ("secretsmanager:NAME") fail with AccessDeniedException, as they do for
// a role whose policy does not allow them.
func (f *Server) DenySecret(source string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.secretModel().denied[source] = true
}

// SecretReads lists the reads that returned a value, in order:
// "ssm:NAME", or "secretsmanager:NAME#VERSION" for a version's value.
func (f *Server) SecretReads() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sec.reads)
}

// serveJSON answers a request of the JSON 1.1 protocol. The caller holds
// f.mu.
func (f *Server) serveJSON(w http.ResponseWriter, r *http.Request, target string) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if r.Method != http.MethodPost {
		f.problem("%s %s: the JSON protocol POSTs", r.Method, target)
	}
	if ct := r.Header.Get("Content-Type"); ct != jsonType {
		f.problem("%s with Content-Type %q, want %q", target, ct, jsonType)
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		f.problem("%s request is not signed with SigV4", target)
	}
	f.calls[target]++
	w.Header().Set("X-Amzn-RequestId", fmt.Sprintf("fake-%d", f.calls[target]))
	if fl := f.fail[target]; fl.n > 0 {
		fl.n--
		f.fail[target] = fl
		writeJSONError(w, fl.status, fl.code, "injected failure")
		return
	}
	m := f.secretModel()
	switch target {
	case ssmTarget + "GetParameter":
		var in struct {
			Name           string
			WithDecryption bool
		}
		if !f.decode(w, target, body, &in) {
			return
		}
		name := strings.TrimPrefix(in.Name, "arn:aws:ssm:us-east-1:123456789012:parameter")
		if m.denied["ssm:"+name] {
			writeJSONError(w, http.StatusBadRequest, "AccessDeniedException", fmt.Sprintf(
				"User: arn:aws:sts::123456789012:assumed-role/baton/i-0 is not authorized to perform: ssm:GetParameter on resource: arn:aws:ssm:us-east-1:123456789012:parameter%s because no identity-based policy allows the ssm:GetParameter action", name))
			return
		}
		p := m.params[name]
		if p == nil {
			writeJSONError(w, http.StatusBadRequest, "ParameterNotFound", "")
			return
		}
		value, typ := p.value, "String"
		if p.secure {
			typ = "SecureString"
			if !in.WithDecryption {
				// What the service returns: the ciphertext.
				value = "AQICAHhBATONFAKECIPHERTEXT" + strings.Repeat("x", len(p.value))
			}
		}
		m.reads = append(m.reads, "ssm:"+name)
		writeJSON(w, map[string]any{"Parameter": map[string]any{
			"Name": name, "Type": typ, "Value": value, "Version": p.version,
			"ARN": "arn:aws:ssm:us-east-1:123456789012:parameter" + name, "DataType": "text",
		}})
	case smTarget + "ListSecretVersionIds":
		var in struct{ SecretId string }
		if !f.decode(w, target, body, &in) {
			return
		}
		s, ok := f.secretFor(w, "secretsmanager:ListSecretVersionIds", in.SecretId)
		if !ok {
			return
		}
		var versions []map[string]any
		for _, v := range s.versions {
			if len(v.stages) == 0 {
				continue // deprecated versions are listed only on request
			}
			versions = append(versions, map[string]any{"VersionId": v.id, "VersionStages": v.stages, "CreatedDate": float64(v.created.UnixMilli()) / 1000})
		}
		writeJSON(w, map[string]any{"ARN": smARN(in.SecretId), "Name": in.SecretId, "Versions": versions})
	case smTarget + "GetSecretValue":
		var in struct{ SecretId, VersionId, VersionStage string }
		if !f.decode(w, target, body, &in) {
			return
		}
		s, ok := f.secretFor(w, "secretsmanager:GetSecretValue", in.SecretId)
		if !ok {
			return
		}
		stage := in.VersionStage
		if stage == "" && in.VersionId == "" {
			stage = "AWSCURRENT"
		}
		for _, v := range s.versions {
			if (in.VersionId == "" || v.id == in.VersionId) && (stage == "" || slices.Contains(v.stages, stage)) {
				m.reads = append(m.reads, "secretsmanager:"+in.SecretId+"#"+v.id)
				writeJSON(w, map[string]any{"ARN": smARN(in.SecretId), "Name": in.SecretId, "VersionId": v.id,
					"SecretString": v.value, "VersionStages": v.stages, "CreatedDate": float64(v.created.UnixMilli()) / 1000})
				return
			}
		}
		writeJSONError(w, http.StatusBadRequest, "ResourceNotFoundException", "Secrets Manager can't find the specified secret value for VersionId: "+in.VersionId+" VersionStage: "+stage)
	default:
		f.problem("unexpected X-Amz-Target %q", target)
		writeJSONError(w, http.StatusBadRequest, "UnknownOperationException", "")
	}
}

// secretFor returns the secret named id, or answers the error that the
// service would. The caller holds f.mu.
func (f *Server) secretFor(w http.ResponseWriter, action, id string) (*secret, bool) {
	m := f.secretModel()
	if m.denied["secretsmanager:"+id] {
		writeJSONError(w, http.StatusBadRequest, "AccessDeniedException", fmt.Sprintf(
			"User: arn:aws:sts::123456789012:assumed-role/baton/i-0 is not authorized to perform: %s on resource: %s because no identity-based policy allows the %s action", action, id, action))
		return nil, false
	}
	s := m.secrets[id]
	if s == nil {
		writeJSONError(w, http.StatusBadRequest, "ResourceNotFoundException", "Secrets Manager can't find the specified secret.")
		return nil, false
	}
	return s, true
}

func smARN(name string) string {
	return "arn:aws:secretsmanager:us-east-1:123456789012:secret:" + name + "-AbCdEf"
}

// decode reads a request body, answering a protocol error when it is not
// the JSON the operation takes.
func (f *Server) decode(w http.ResponseWriter, target string, body []byte, v any) bool {
	if err := json.Unmarshal(body, v); err != nil {
		f.problem("%s: body %q: %v", target, body, err)
		writeJSONError(w, http.StatusBadRequest, "SerializationException", err.Error())
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", jsonType)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONError answers an error as the JSON 1.1 services do.
func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", jsonType)
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": msg})
}
