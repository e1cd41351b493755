package awsfake

import (
	"encoding/xml"
	"net/http"
	"slices"
)

func init() {
	register("DescribeAutoScalingInstances", false, (*Server).describeAutoScalingInstances)
	register("DescribeAutoScalingGroups", false, (*Server).describeAutoScalingGroups)
}

type asgInstanceXML struct {
	InstanceID           string `xml:"InstanceId"`
	AutoScalingGroupName string `xml:"AutoScalingGroupName,omitempty"`
	AvailabilityZone     string `xml:"AvailabilityZone"`
	LifecycleState       string `xml:"LifecycleState"`
	HealthStatus         string `xml:"HealthStatus"`
	ProtectedFromScaleIn bool   `xml:"ProtectedFromScaleIn"`
}

type asgGroupXML struct {
	AutoScalingGroupName string           `xml:"AutoScalingGroupName"`
	AutoScalingGroupARN  string           `xml:"AutoScalingGroupARN"`
	MinSize              int              `xml:"MinSize"`
	MaxSize              int              `xml:"MaxSize"`
	DesiredCapacity      int              `xml:"DesiredCapacity"`
	Instances            []asgInstanceXML `xml:"Instances>member"`
}

type describeAutoScalingGroupsResponse struct {
	XMLName   xml.Name      `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ DescribeAutoScalingGroupsResponse"`
	Groups    []asgGroupXML `xml:"DescribeAutoScalingGroupsResult>AutoScalingGroups>member"`
	NextToken string        `xml:"DescribeAutoScalingGroupsResult>NextToken,omitempty"`
	RequestID string        `xml:"ResponseMetadata>RequestId"`
}

type describeAutoScalingInstancesResponse struct {
	XMLName   xml.Name         `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ DescribeAutoScalingInstancesResponse"`
	Instances []asgInstanceXML `xml:"DescribeAutoScalingInstancesResult>AutoScalingInstances>member"`
	NextToken string           `xml:"DescribeAutoScalingInstancesResult>NextToken,omitempty"`
	RequestID string           `xml:"ResponseMetadata>RequestId"`
}

func (f *Server) asgXML(in *Instance, withGroup bool) asgInstanceXML {
	x := asgInstanceXML{InstanceID: in.ID, AvailabilityZone: "us-east-1a", LifecycleState: in.Lifecycle, HealthStatus: in.Health}
	if withGroup {
		x.AutoScalingGroupName = in.Group
	}
	return x
}

func (f *Server) describeAutoScalingInstances(w http.ResponseWriter, r *http.Request) {
	ids := listParam(r, "InstanceIds.member")
	var found []asgInstanceXML
	for _, id := range ids {
		if in, ok := f.instances[id]; ok && in.Group != "" {
			found = append(found, f.asgXML(in, true))
		}
	}
	writeXML(w, describeAutoScalingInstancesResponse{Instances: found, RequestID: "req-asi"})
}

func (f *Server) describeAutoScalingGroups(w http.ResponseWriter, r *http.Request) {
	names := listParam(r, "AutoScalingGroupNames.member")
	if len(names) == 0 {
		for name := range f.groups {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var groups []asgGroupXML
	for _, name := range names {
		if !f.groups[name] {
			continue // unknown names are left out, as AWS does
		}
		g := asgGroupXML{
			AutoScalingGroupName: name,
			AutoScalingGroupARN:  "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:0:autoScalingGroupName/" + name,
			MaxSize:              1000,
		}
		for _, id := range f.order {
			if in := f.instances[id]; in.Group == name {
				g.Instances = append(g.Instances, f.asgXML(in, false))
			}
		}
		g.DesiredCapacity = len(g.Instances)
		if n, ok := f.desired[name]; ok {
			g.DesiredCapacity = n
		}
		groups = append(groups, g)
	}
	from, to, next, ok := page(len(groups), f.pageSize, r.Form.Get("NextToken"))
	if !ok {
		writeASGError(w, http.StatusBadRequest, "InvalidNextToken", "The token is invalid.")
		return
	}
	writeXML(w, describeAutoScalingGroupsResponse{Groups: groups[from:to], NextToken: next, RequestID: "req-asg"})
}

type asgErrorResponse struct {
	XMLName   xml.Name `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ ErrorResponse"`
	Type      string   `xml:"Error>Type"`
	Code      string   `xml:"Error>Code"`
	Message   string   `xml:"Error>Message"`
	RequestID string   `xml:"RequestId"`
}

func writeASGError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	xml.NewEncoder(w).Encode(asgErrorResponse{Type: "Sender", Code: code, Message: msg, RequestID: "req-err"})
}
