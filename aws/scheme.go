package aws

import (
	"fmt"
	"strings"

	"github.com/batonhq/baton/discovery"
)

// schemeAWSASG is the discovery.Parse scheme of an Auto Scaling group.
const schemeAWSASG = "aws-asg"

// ASGScheme returns the "aws-asg[:GROUP]" scheme for discovery.Options, whose
// specs NewASG builds with opts: Port, when zero, is set to Parse's
// defaultPort, and GroupName, when the spec names a group, to that group.
func ASGScheme(opts ASGOptions) discovery.Scheme {
	return discovery.Scheme{
		Name: schemeAWSASG,
		Form: schemeAWSASG + "[:GROUP]",
		Build: func(rest string, hasRest bool, defaultPort int) (discovery.Discoverer, error) {
			o := opts
			if hasRest {
				group := strings.TrimSpace(rest)
				if group == "" {
					return nil, fmt.Errorf("the group name after %q is empty; write %q for this instance's own group",
						schemeAWSASG+":", schemeAWSASG)
				}
				o.GroupName = group
			}
			if o.Port == 0 {
				o.Port = defaultPort
			}
			return NewASG(o)
		},
	}
}

func validPort(p int) bool { return p >= 1 && p <= 65535 }
